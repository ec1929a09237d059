"""The ``outbox`` command. Each subcommand is a ``setup_*`` function that adds its parser, in
``COMMANDS``, and a ``_cmd_*`` function it runs.

``main`` imports only the module of the subcommand it runs (``COMMANDS`` names it by its path),
so a command starts without loading what the others need: ``outbox health``, which a container
runs every few seconds, reads its files without psycopg, Dramatiq or an application. ``outbox
--help`` and a command line without a known subcommand load them all.

A failing command prints one line on stderr and exits 1 (runtime) or 2 (usage, configuration);
``outbox.cli_errors`` says which error is which.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

from outbox.cli_errors import DEBUG_ENV, EXIT_INTERRUPTED, explain
from outbox.logs import configure_logging

Setup = Callable[[argparse._SubParsersAction], None]

#: Each subcommand, and the ``module:function`` that adds its parser (one function may add
#: several); in the order ``outbox --help`` lists them.
COMMANDS: dict[str, str] = {
    "migrate": "outbox.cli_commands:setup_migrate",
    "prune": "outbox.cli_commands:setup_prune",
    "erase": "outbox.cli_commands:setup_erase",
    "status": "outbox.cli_commands:setup_status",
    "inspect": "outbox.cli_commands:setup_inspect",
    "claimer": "outbox.dispatch.commands:setup_claimer",
    "worker": "outbox.dispatch.commands:setup_worker",
    "demo": "outbox.demo.commands:setup_demo",
    "dashboard": "outbox.demo.commands:setup_dashboard",
    "console": "outbox.demo.commands:setup_dashboard",
    "webhooks": "outbox.webhook.commands:setup_webhooks",
    "resolve": "outbox.operator.commands:setup_operator",
    "retry": "outbox.operator.commands:setup_operator",
    "cancel": "outbox.operator.commands:setup_operator",
    "admit": "outbox.operator.commands:setup_operator",
    "refuse": "outbox.operator.commands:setup_operator",
    "pause": "outbox.operator.commands:setup_operator",
    "resume": "outbox.operator.commands:setup_operator",
    "health": "outbox.health.commands:setup_health",
}


def _setup(path: str) -> Setup:
    module, function = path.split(":")
    setup: Setup = getattr(importlib.import_module(module), function)
    return setup


#: Subcommands whose arguments after ``--`` are passed on as they are (to ``dramatiq``).
PASSTHROUGH = frozenset({"worker"})


def package_version() -> str:
    """The installed distribution's version (its metadata), ``unknown`` from a bare checkout."""
    try:
        return metadata.version("outbox")
    except metadata.PackageNotFoundError:
        return "unknown"


def _add_global_options(parser: argparse.ArgumentParser, default: Any) -> None:
    parser.add_argument(
        "-v", "--verbose", action="store_true", default=default, help="log at DEBUG level"
    )
    parser.add_argument(
        "--debug",
        action="store_true",
        default=default,
        help=f"print the traceback of a failure (also ${DEBUG_ENV}=1)",
    )


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The ``outbox`` parser: with ``command`` one of ``COMMANDS``, only the parsers its setup
    adds (its module alone is imported); otherwise every subcommand's."""
    parser = argparse.ArgumentParser(
        prog="outbox",
        description="Carry out an application's effects on the outside world.",
        epilog="exit status: 0 ok, 1 runtime failure, 2 usage or configuration error",
    )
    parser.add_argument("--version", action="version", version=f"outbox {package_version()}")
    _add_global_options(parser, default=False)
    sub = parser.add_subparsers(dest="command", required=True)
    paths = [COMMANDS[command]] if command in COMMANDS else COMMANDS.values()
    for path in dict.fromkeys(paths):  # each setup once, in order
        _setup(path)(sub)
    for subparser in sub.choices.values():
        # Also after the subcommand; SUPPRESS keeps the value given before it.
        _add_global_options(subparser, default=argparse.SUPPRESS)
    return parser


def parse(parser: argparse.ArgumentParser, argv: Sequence[str]) -> argparse.Namespace:
    """``argv`` parsed; for a passthrough subcommand, what follows the first ``--`` is its
    ``dramatiq_args``, so its own options work before and after APP."""
    argv = list(argv)
    if "--" in argv:
        cut = argv.index("--")
        head, tail = argv[:cut], argv[cut + 1 :]
        command = next((a for a in head if not a.startswith("-")), None)
        if command in PASSTHROUGH:
            args = parser.parse_args(head)
            args.dramatiq_args = tail
            return args
    return parser.parse_args(argv)


def _debug_chosen(args: argparse.Namespace) -> bool:
    return bool(args.debug) or os.environ.get(DEBUG_ENV, "").strip().lower() in {
        "1",
        "true",
        "yes",
        "on",
    }


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand a command line names: its first word that is not an option (the options
    before a subcommand take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse(build_parser(_command_of(argv)), argv)
    configure_logging(args.verbose)  # JSON lines when OUTBOX_LOG_FORMAT=json
    try:
        return int(args.func(args) or 0)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except Exception as error:
        if _debug_chosen(args):
            traceback.print_exc()
        failure = explain(error)
        print(f"outbox {args.command}: {failure.message}", file=sys.stderr)
        return failure.status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
