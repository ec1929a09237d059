"""The ``outbox`` subcommands that read or change the outbox's tables directly: ``migrate``,
``prune``, ``erase``, ``status`` and ``inspect`` (registered in ``outbox.cli``)."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import timedelta
from typing import Any

import psycopg

from outbox.cli_args import non_negative_float, non_negative_int, positive_int
from outbox.cli_deletion import Consent, erase_command, prune_command
from outbox.erasure import ErasureReport, erase_subject
from outbox.limits_view import limits_view, render_limits
from outbox.loader import load_app
from outbox.outbox import Outbox
from outbox.retention import DEFAULT_BATCH_SIZE as DEFAULT_PRUNE_BATCH
from outbox.retention import prune
from outbox.status import (
    disabled_webhook_endpoints,
    inspect,
    json_default,
    render_disabled_webhook_endpoints,
    render_inspect,
    render_status,
    status,
)


def _outbox(args: argparse.Namespace) -> Outbox:
    """The application's outbox if APP was given, else one on the environment's settings."""
    overrides = {"database_url": getattr(args, "database_url", None)}
    if getattr(args, "schema", None):
        overrides["schema"] = args.schema
    if getattr(args, "app", None):
        app = load_app(args.app)
        app.settings = app.settings.with_overrides(**overrides)
        return app
    return Outbox(**overrides)


def _add_common(parser: argparse.ArgumentParser, app: str = "?") -> None:
    parser.add_argument(
        "app",
        nargs=app,
        metavar="APP",
        help="module:object of the application's Outbox (declares kinds and adapters)",
    )
    parser.add_argument("--database-url", help="PostgreSQL URL (default: $OUTBOX_DATABASE_URL)")
    parser.add_argument("--schema", help="PostgreSQL schema (default: $OUTBOX_SCHEMA or outbox)")


def _cmd_migrate(args: argparse.Namespace) -> int:
    report = _outbox(args).migrate()
    if args.json:
        print(json.dumps({"applied": report.applied, "kinds_declared": report.kinds_declared}))
    else:
        print(f"applied: {', '.join(report.applied) or 'nothing (up to date)'}")
        print(f"kinds declared or changed: {', '.join(report.kinds_declared) or 'none'}")
    return 0


def setup_migrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("migrate", help="apply migrations and declare the application's kinds")
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_migrate)


def _connect(args: argparse.Namespace) -> tuple[Outbox, psycopg.Connection[Any]]:
    app = _outbox(args)
    return app, psycopg.connect(app.settings.require_database_url())


def _print_json(value: Any) -> None:
    print(json.dumps(value, default=json_default, indent=2, sort_keys=True))


def _cmd_prune(args: argparse.Namespace) -> int:
    app, conn = _connect(args)
    configured = app.settings.retention
    retention = (
        timedelta(days=args.retention_days) if args.retention_days is not None else configured
    )
    with conn:
        return prune_command(
            conn,
            schema=app.schema,
            retention=retention,
            configured=configured,
            threshold=_threshold(args, app),
            dry_run=args.dry_run,
            consent=Consent.from_args(args),
            prune=lambda: prune(conn, retention, schema=app.schema, batch_size=args.batch_size),
            as_json=args.json,
            emit=_print_json,
        )


def _threshold(args: argparse.Namespace, app: Outbox) -> int:
    given: int | None = args.confirm_threshold
    return app.settings.confirm_threshold if given is None else given


def _add_deletion_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="count what would be deleted, by kind and state, and delete nothing",
    )
    parser.add_argument(
        "--yes", action="store_true", help="delete without asking, however many (scripts, cron)"
    )
    parser.add_argument(
        "--confirm-threshold",
        type=non_negative_int,
        help="ask before deleting more actions than this (default: $OUTBOX_CONFIRM_THRESHOLD "
        "or 1000)",
    )


def setup_prune(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("prune", help="delete actions that ended more than the retention ago")
    _add_common(p)
    p.add_argument(
        "--retention-days",
        type=non_negative_float,
        help="delete actions ended more than this many days ago (default: $OUTBOX_RETENTION_SECONDS"
        " or 30 days); shorter than the configured retention needs a confirmation",
    )
    p.add_argument(
        "--batch-size", type=positive_int, default=DEFAULT_PRUNE_BATCH, help="rows per batch"
    )
    _add_deletion_options(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_prune)


def _cmd_erase(args: argparse.Namespace) -> int:
    app, conn = _connect(args)

    def erase() -> ErasureReport:
        with conn.transaction():
            return erase_subject(conn, args.account, schema=app.schema)

    with conn:
        return erase_command(
            conn,
            schema=app.schema,
            account=args.account,
            threshold=_threshold(args, app),
            dry_run=args.dry_run,
            consent=Consent.from_args(args),
            erase=erase,
            as_json=args.json,
            emit=_print_json,
        )


def setup_erase(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("erase", help="delete every action whose subject is an account")
    _add_common(p)
    p.add_argument("--account", required=True, help="the subject account id")
    _add_deletion_options(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_erase)


def _cmd_status(args: argparse.Namespace) -> int:
    app, conn = _connect(args)
    with conn:
        report = status(conn, schema=app.schema, latest=args.latest)
        disabled = disabled_webhook_endpoints(conn, schema=app.schema)
        limits = limits_view(conn, app.kind_limits(), schema=app.schema)
    if args.json:
        _print_json(
            {
                **report.as_dict(),
                "disabled_webhook_endpoints": disabled,
                "limits": limits.as_dict(),
            }
        )
    else:
        print(render_status(report, app.settings.outage_rule))
        print(render_disabled_webhook_endpoints(disabled))
        print(render_limits(limits))
    return 0


def setup_status(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("status", help="counts, backlog, blocked lanes, latest UNCERTAIN/FAILED")
    _add_common(p)
    p.add_argument(
        "--latest", type=non_negative_int, default=10, help="how many latest ended to list"
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_status)


def _cmd_inspect(args: argparse.Namespace) -> int:
    app, conn = _connect(args)
    with conn:
        found = inspect(conn, args.id, schema=app.schema)
    if found is None:
        print(
            f"outbox inspect: no action {args.id} (never existed, erased or pruned)",
            file=sys.stderr,
        )
        return 1
    if args.json:
        _print_json(found)
    else:
        print(render_inspect(found))
    return 0


def setup_inspect(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inspect", help="one action's fields, lane and history")
    p.add_argument("id", type=positive_int, metavar="ID", help="the action id")
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print the action as JSON")
    p.set_defaults(func=_cmd_inspect)
