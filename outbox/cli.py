"""The ``outbox`` command. Each subcommand is one ``_cmd_*`` function registered in ``COMMANDS``."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable

from outbox.errors import OutboxError
from outbox.loader import load_app
from outbox.outbox import Outbox


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


def _setup_migrate(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("migrate", help="apply migrations and declare the application's kinds")
    _add_common(p)
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.set_defaults(func=_cmd_migrate)


#: Each entry adds one subcommand to the parser.
COMMANDS: list[Callable[[argparse._SubParsersAction], None]] = [_setup_migrate]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="outbox", description="Carry out an application's effects on the outside world."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log at DEBUG level")
    sub = parser.add_subparsers(dest="command", required=True)
    for setup in COMMANDS:
        setup(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except OutboxError as error:
        print(f"outbox {args.command}: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
