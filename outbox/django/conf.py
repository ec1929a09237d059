"""``settings.OUTBOX`` as the outbox's ``Settings``.

Keys are ``Settings`` field names in upper or lower case (``SCHEMA``, ``LEASE``: durations in
seconds or as ``timedelta``), plus ``APP`` (``module:object`` of the project's ``Outbox``) and
``DATABASE`` (the ``DATABASES`` alias, "default" unless given). The database URL, unless given,
is the alias's own connection (host, port, name, user, password, libpq options). What the
environment sets (``OUTBOX_*``) is the base; ``settings.OUTBOX`` overrides it.
"""

from __future__ import annotations

from dataclasses import fields
from datetime import timedelta
from functools import cache
from typing import Any

from psycopg.conninfo import make_conninfo

from outbox.config import Settings
from outbox.errors import ConfigurationError
from outbox.loader import load_app
from outbox.outbox import Outbox

#: Keys of ``settings.OUTBOX`` that are not ``Settings`` fields.
OWN_KEYS = frozenset({"APP", "DATABASE"})
#: Keys of a ``DATABASES`` entry's ``OPTIONS`` that are Django's, not libpq's.
_DJANGO_OPTIONS = frozenset(
    {"pool", "server_side_binding", "isolation_level", "assume_role", "cursor_factory", "context"}
)


def configured() -> dict[str, Any]:
    from django.conf import settings

    raw = getattr(settings, "OUTBOX", {}) or {}
    if not isinstance(raw, dict):
        raise ConfigurationError(f"settings.OUTBOX must be a dict, not {type(raw).__name__}")
    return {str(key).upper(): value for key, value in raw.items()}


def database_alias() -> str:
    return str(configured().get("DATABASE", "default"))


def database_url(alias: str) -> str:
    """A libpq connection string for a ``DATABASES`` alias (PostgreSQL only)."""
    from django.conf import settings

    entry = settings.DATABASES.get(alias)
    if entry is None:
        raise ConfigurationError(f"settings.OUTBOX DATABASE {alias!r} is not in DATABASES")
    if "postgresql" not in str(entry.get("ENGINE", "")):
        raise ConfigurationError(
            f"DATABASES[{alias!r}] is {entry.get('ENGINE')}: the outbox needs PostgreSQL"
        )
    options = {k: v for k, v in (entry.get("OPTIONS") or {}).items() if k not in _DJANGO_OPTIONS}
    params = {
        "dbname": entry.get("NAME") or None,
        "user": entry.get("USER") or None,
        "password": entry.get("PASSWORD") or None,
        "host": entry.get("HOST") or None,
        "port": str(entry["PORT"]) if entry.get("PORT") else None,
        **options,
    }
    return make_conninfo(**{k: v for k, v in params.items() if v is not None})


def _value(name: str, kind: str, value: Any) -> Any:
    if kind == "timedelta" and not isinstance(value, timedelta):
        try:
            return timedelta(seconds=float(value))
        except (TypeError, ValueError):
            raise ConfigurationError(
                f"settings.OUTBOX {name.upper()}: {value!r} is not a number of seconds"
            ) from None
    return value


def outbox_settings() -> Settings:
    """The outbox's ``Settings`` from the environment and ``settings.OUTBOX``."""
    given = configured()
    types = {f.name: str(f.type) for f in fields(Settings)}
    overrides: dict[str, Any] = {}
    for key, value in given.items():
        if key in OWN_KEYS:
            continue
        name = key.lower()
        if name not in types:
            known = ", ".join(sorted(n.upper() for n in types) + sorted(OWN_KEYS))
            raise ConfigurationError(f"settings.OUTBOX has no key {key!r}; known: {known}")
        overrides[name] = _value(name, types[name], value)
    base = Settings.from_env()
    if "database_url" not in overrides:
        overrides["database_url"] = database_url(database_alias())
    return base.with_overrides(**overrides)


@cache
def get_outbox() -> Outbox:
    """The project's ``Outbox`` (``settings.OUTBOX["APP"]``), or one with only the built-in
    kinds, on ``outbox_settings()``; built once a process."""
    app_path = configured().get("APP")
    settings = outbox_settings()
    if app_path:
        app = load_app(str(app_path))
        app.settings = settings
        return app
    return Outbox(settings=settings)
