"""The ``outbox demo`` and ``outbox dashboard`` (alias ``outbox console``) subcommands
(registered in ``outbox.cli``)."""

from __future__ import annotations

import argparse
import logging

from psycopg_pool import ConnectionPool

from outbox.cli_args import port, positive_float, positive_int
from outbox.demo.schema import DEMO_SCHEMA
from outbox.loader import load_app
from outbox.outbox import Outbox

log = logging.getLogger("outbox.console")


def _cmd_demo(args: argparse.Namespace) -> int:
    from outbox.demo.run import main

    # The progress bar and the table are the demo's output: the per-attempt log lines (retries,
    # the UNCERTAIN warnings) would scroll it away, so only errors are shown unless -v.
    logging.getLogger().setLevel(logging.ERROR if not args.verbose else logging.DEBUG)
    return main(people=args.people, timeout=args.timeout, schema=args.schema)


def setup_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="run the outbox end to end: embedded PostgreSQL, in-process broker and SMTP sink "
        "unless OUTBOX_DATABASE_URL / OUTBOX_BROKER_URL / OUTBOX_SMTP_URL are set",
    )
    p.add_argument(
        "--people", type=positive_int, default=200, help="demo people to email (default 200)"
    )
    p.add_argument(
        "--timeout", type=positive_float, default=120.0, help="give up after this many seconds"
    )
    p.add_argument(
        "--schema",
        default=DEMO_SCHEMA,
        help=f"the demo's own schema (default {DEMO_SCHEMA}; not $OUTBOX_SCHEMA): created and "
        "marked by the demo, dropped by its next run; a schema it did not create is never dropped",
    )
    p.set_defaults(func=_cmd_demo)


def _cmd_dashboard(args: argparse.Namespace) -> int:
    from outbox.console import create_app, serve

    app = load_app(args.app) if args.app else Outbox()
    overrides = {"database_url": args.database_url, "schema": args.schema}
    app.settings = app.settings.with_overrides(**overrides)
    settings = app.settings
    broker = None
    if settings.broker_url:
        from outbox.dispatch.broker import broker_from_url

        broker = broker_from_url(settings.broker_url)
        for kind in app.kinds.values():
            broker.declare_queue(kind.queue_name)
    pool = ConnectionPool(
        settings.require_database_url(), min_size=1, max_size=4, open=False, name="console"
    )
    console = create_app(
        pool,
        app.schema,
        broker=broker,
        users=settings.console_users,
        secret_key=settings.console_secret_key,
        outage_rule=settings.outage_rule,
    )
    # Refuses a wide bind without a login (unless told the container publishes it on loopback).
    server = serve(console, args.host, args.port, published_on_loopback=args.published_on_loopback)
    pool.open()
    print(
        f"outbox console on http://{args.host}:{server.effective_port}/ (Ctrl-C to stop)",
        flush=True,
    )
    try:
        server.run()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
        pool.close()
    return 0


def setup_dashboard(sub: argparse._SubParsersAction) -> None:
    # Two parsers rather than an argparse alias: the global options are added to each parser
    # in ``sub.choices``, where an alias would be the same parser twice.
    for name, help_text in (
        (
            "dashboard",
            "serve the web console: actions, UNCERTAIN, blocked lanes, processes, and the "
            "operator's verbs (loopback only unless OUTBOX_CONSOLE_USERS is set)",
        ),
        ("console", "the same as `outbox dashboard`"),
    ):
        p = sub.add_parser(name, help=help_text)
        p.add_argument(
            "app", nargs="?", metavar="APP", help="module:object of the application's Outbox"
        )
        p.add_argument("--database-url", help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL)")
        p.add_argument("--schema", help="PostgreSQL schema (default: $OUTBOX_SCHEMA or outbox)")
        p.add_argument(
            "--host",
            default="127.0.0.1",
            help="address to listen on (default 127.0.0.1; any other needs OUTBOX_CONSOLE_USERS)",
        )
        p.add_argument("--port", type=port, default=8080, help="port (default 8080; 0 picks one)")
        p.add_argument(
            "--published-on-loopback",
            action="store_true",
            help="in a container whose port mapping publishes the console on the host's "
            "127.0.0.1 only: listen on --host without a login (docker-compose.yml uses it)",
        )
        p.set_defaults(func=_cmd_dashboard)
