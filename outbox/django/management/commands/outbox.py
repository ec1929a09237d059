"""``manage.py outbox VERB [ARGS]``: any ``outbox`` command (claimer, worker, status, prune,
erase, inspect, ...) on the project's database, schema and ``settings.OUTBOX["APP"]``.

The database URL and schema go to the command through ``OUTBOX_DATABASE_URL`` and
``OUTBOX_SCHEMA`` in this process's environment (so the worker's own processes see them too),
never on a command line where ``ps`` would show a password.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from outbox.config import env_name
from outbox.django.conf import OWN_KEYS, configured, outbox_settings

#: Verbs that take the application's Outbox as their first argument.
_TAKES_APP = frozenset({"migrate", "claimer", "worker", "prune", "erase", "status"})


class Command(BaseCommand):
    help = "Run an outbox command (outbox --help) on the project's database and settings."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("verb", help="the outbox command: claimer, worker, status, ...")
        parser.add_argument("rest", nargs="*", help="its arguments (after --)")

    def run_from_argv(self, argv: list[str]) -> None:
        # Everything after the verb is the outbox command's own, options included.
        self._argv = argv[2:]
        super().run_from_argv(argv[:3])

    def handle(self, *args: Any, **options: Any) -> None:
        from outbox.cli import main

        argv = list(getattr(self, "_argv", [options["verb"], *options["rest"]]))
        settings = outbox_settings()
        given = configured()
        environment = {env_name("database_url"): settings.require_database_url()}
        for key in given.keys() - OWN_KEYS:
            value = getattr(settings, key.lower())
            seconds = getattr(value, "total_seconds", None)
            environment[env_name(key.lower())] = str(seconds() if seconds else value)
        app = given.get("APP")
        if app and argv and argv[0] in _TAKES_APP and not _names_app(argv[1:]):
            argv.insert(1, str(app))
        saved = {name: os.environ.get(name) for name in environment}
        os.environ.update(environment)
        try:
            status = main(argv)
        finally:  # the process goes on (call_command, tests): leave its environment as it was
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        if status:
            raise CommandError(f"outbox {argv[0] if argv else ''} exited {status}", status)
        sys.stdout.flush()


def _names_app(rest: list[str]) -> bool:
    """Whether the arguments already name an APP (module:object) before any option."""
    return bool(rest) and not rest[0].startswith("-") and ":" in rest[0]
