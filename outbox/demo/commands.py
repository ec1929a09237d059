"""The ``outbox demo`` and ``outbox dashboard`` subcommands (registered in ``outbox.cli``)."""

from __future__ import annotations

import argparse
import logging

from psycopg_pool import ConnectionPool

from outbox.cli_args import port, positive_float, positive_int
from outbox.demo.schema import DEMO_SCHEMA
from outbox.loader import load_app
from outbox.outbox import Outbox

log = logging.getLogger("outbox.dashboard")


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
    from outbox.dashboard import DashboardApp, serve

    app = load_app(args.app) if args.app else Outbox()
    overrides = {"database_url": args.database_url, "schema": args.schema}
    app.settings = app.settings.with_overrides(**overrides)
    broker = None
    if app.settings.broker_url:
        from outbox.dispatch.broker import broker_from_url

        broker = broker_from_url(app.settings.broker_url)
        for kind in app.kinds.values():
            broker.declare_queue(kind.queue_name)
    pool = ConnectionPool(app.settings.require_database_url(), min_size=1, max_size=4, open=True)
    server = serve(DashboardApp(pool, app.schema, broker), args.host, args.port)
    print(f"outbox dashboard on http://{args.host}:{server.server_port}/ (Ctrl-C to stop)")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        pool.close()
    return 0


def setup_dashboard(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("dashboard", help="serve a small web page of the outbox's state")
    p.add_argument(
        "app", nargs="?", metavar="APP", help="module:object of the application's Outbox"
    )
    p.add_argument("--database-url", help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL)")
    p.add_argument("--schema", help="PostgreSQL schema (default: $OUTBOX_SCHEMA or outbox)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=port, default=8080, help="port (default 8080; 0 picks one)")
    p.set_defaults(func=_cmd_dashboard)
