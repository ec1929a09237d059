"""Applies migrations/*.sql in order, each once, and keeps ``agent_action_kind`` in step.

Everything runs in one transaction under an advisory lock, so replicas that migrate at once
queue up and the later ones find nothing to do.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from psycopg import Connection, sql

from outbox._io import Operation, Statement, run_sync
from outbox.errors import KindConflictError
from outbox.kinds import BUILTIN_KINDS, ActionKind
from outbox.queries import queries_for, validate_schema

log = logging.getLogger(__name__)

_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
#: First key of the advisory lock that serialises migrations (the second is the schema's hash).
_LOCK_KEY = 0x0B0C


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str


#: Where an installed package keeps its migrations (the wheel copies migrations/ there).
PACKAGED_MIGRATIONS = "_migrations"


def _is_outbox_checkout(root: Path) -> bool:
    """Whether ``root`` is this project's source tree (its pyproject.toml names ``outbox``)."""
    try:
        text = (root / "pyproject.toml").read_text()
    except OSError:
        return False
    return re.search(r'(?m)^name\s*=\s*"outbox"\s*$', text) is not None


def _migrations_dir() -> Path:
    """The package's own migrations: ``outbox/_migrations`` when installed from a wheel, else
    the source checkout's top-level migrations/ (an editable install or a repo on sys.path).
    Never a ``migrations`` folder found by its name next to the package: in site-packages that
    is whichever other distribution installed one."""
    packaged = Path(str(resources.files("outbox").joinpath(PACKAGED_MIGRATIONS)))
    if packaged.is_dir():
        return packaged
    root = Path(__file__).resolve().parent.parent
    if _is_outbox_checkout(root) and (root / "migrations").is_dir():
        return root / "migrations"
    raise RuntimeError(
        f"no migrations: neither {packaged} (an installed outbox) nor an outbox source checkout's "
        "migrations/ folder; reinstall the outbox package"
    )


def available_migrations() -> list[Migration]:
    found = []
    for path in sorted(_migrations_dir().iterdir()):
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(int(match[1]), match[2], path.read_text()))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise RuntimeError(f"two migrations share a version in {_migrations_dir()}")
    return found


@dataclass(frozen=True, slots=True)
class MigrationReport:
    applied: list[str]
    kinds_declared: list[str]


def migrate(
    conn: Connection[Any], schema: str, kinds: Iterable[ActionKind] = ()
) -> MigrationReport:
    """Bring ``schema`` up to date and declare ``kinds`` (plus the built-in ones); commits.

    Raises ``KindConflictError`` (and changes nothing) when a kind's flags would change while it
    has actions that have not ended.
    """
    validate_schema(schema)
    ident = sql.Identifier(schema)
    applied: list[str] = []
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))", (_LOCK_KEY, schema))
        conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(ident))
        conn.execute(
            sql.SQL(
                "CREATE TABLE IF NOT EXISTS {}.outbox_migration ("
                " version integer PRIMARY KEY, name text NOT NULL,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            ).format(ident)
        )
        done = {
            row[0]
            for row in conn.execute(
                sql.SQL("SELECT version FROM {}.outbox_migration").format(ident)
            ).fetchall()
        }
        for migration in available_migrations():
            if migration.version in done:
                continue
            conn.execute(sql.SQL("SET LOCAL search_path TO {}").format(ident))
            conn.execute(migration.sql.encode())
            conn.execute(sql.SQL("RESET search_path"))
            conn.execute(
                sql.SQL("INSERT INTO {}.outbox_migration (version, name) VALUES (%s, %s)").format(
                    ident
                ),
                (migration.version, migration.name),
            )
            applied.append(f"{migration.version:04d}_{migration.name}")
            log.info(
                "applied migration %04d_%s to schema %s", migration.version, migration.name, schema
            )
        declared = run_sync(conn, _declare_kinds(schema, _with_builtins(kinds)))
    return MigrationReport(applied=applied, kinds_declared=declared)


def _with_builtins(kinds: Iterable[ActionKind]) -> list[ActionKind]:
    by_name: dict[str, ActionKind] = {k.name: k for k in BUILTIN_KINDS}
    for kind in kinds:
        known = by_name.get(kind.name)
        if known is not None and known != kind:
            raise KindConflictError(
                f"kind {kind.name} is declared twice with different flags: {known} and {kind}"
            )
        by_name[kind.name] = kind
    return sorted(by_name.values(), key=lambda k: k.name)


def _declare_kinds(schema: str, kinds: list[ActionKind]) -> Operation[list[str]]:
    q = queries_for(schema)
    rows = yield Statement(q["declared_kinds"])
    known = {row["name"]: row for row in rows}
    changed: list[str] = []
    for kind in kinds:
        row = known.get(kind.name)
        if row is not None and (row["at_most_once"], row["instance_level"]) == (
            kind.at_most_once,
            kind.instance_level,
        ):
            continue
        if row is not None:
            live = yield Statement(q["live_actions_of_kind"], {"kind": kind.name})
            if live[0]["n"]:
                raise KindConflictError(
                    f"kind {kind.name}: refusing to change at_most_once "
                    f"{row['at_most_once']}->{kind.at_most_once}, instance_level "
                    f"{row['instance_level']}->{kind.instance_level} while {live[0]['n']} of its "
                    f"actions have not ended; let them end (or cancel them) and migrate again"
                )
        yield Statement(
            q["declare_kind"],
            {
                "name": kind.name,
                "at_most_once": kind.at_most_once,
                "instance_level": kind.instance_level,
            },
        )
        changed.append(kind.name)
    return changed
