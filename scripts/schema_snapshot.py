"""Writes schema.sql: the tables, indexes, functions and triggers of a freshly migrated schema.

    .venv/bin/python -m scripts.schema_snapshot            # rewrite schema.sql (make schema)
    .venv/bin/python -m scripts.schema_snapshot --check    # exit 1 when schema.sql is stale

It migrates a throwaway schema with every file in migrations/, dumps it with
``pg_dump --schema-only --schema=<it>``, drops it, and normalises the dump so it reads as one
file: the throwaway name becomes ``outbox`` (the default schema), and pg_dump's session
settings, version lines and per-object comment blocks are dropped. The database comes from
``--database-url``, else ``OUTBOX_TEST_DATABASE_URL``, else the local test database.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg

from outbox.migrate import migrate

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO / "schema.sql"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"
#: The name the snapshot uses for the schema (the default of ``Settings.schema``).
SHOWN_SCHEMA = "outbox"

HEADER = """\
-- The outbox's schema as a fresh `outbox migrate` leaves it, for reading (not for applying:
-- migrations/ is what runs). Regenerate with `make schema`; tests/test_schema_snapshot.py fails
-- when this file and migrations/ disagree. The schema is shown as `outbox`, the default name.
"""

#: pg_dump lines that describe the dump session, not the schema.
_NOISE = re.compile(
    r"^(SET |SELECT pg_catalog\.set_config\(|\\restrict |\\unrestrict |-- Dumped |"
    r"-- PostgreSQL database dump)"
)
_OBJECT_COMMENT = re.compile(r"^-- Name: (?P<name>.+?); Type: (?P<type>[A-Z ]+); Schema: ")


def database_url(explicit: str | None = None) -> str:
    return explicit or os.environ.get("OUTBOX_TEST_DATABASE_URL", DEFAULT_DATABASE_URL)


def dump_fresh_schema(url: str) -> str:
    """The snapshot of a schema migrated from scratch (created and dropped here)."""
    schema = f"schema_snapshot_{uuid.uuid4().hex[:12]}"
    try:
        with psycopg.connect(url) as conn:
            migrate(conn, schema)
        return dump_schema(url, schema)
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def dump_schema(url: str, schema: str) -> str:
    """pg_dump of ``schema`` as it is now, normalised."""
    if shutil.which("pg_dump") is None:
        raise RuntimeError("pg_dump not found on PATH (install the PostgreSQL client)")
    dumped = subprocess.run(
        [
            "pg_dump",
            "--schema-only",
            f"--schema={schema}",
            "--no-owner",
            "--no-privileges",
            "--dbname",
            url,
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return normalise(dumped, schema)


def normalise(dump: str, schema: str) -> str:
    """The dump as one readable file: session noise dropped, the schema named ``outbox``."""
    lines: list[str] = []
    for line in dump.replace(schema, SHOWN_SCHEMA).splitlines():
        line = line.rstrip()
        if _NOISE.match(line):
            continue
        named = _OBJECT_COMMENT.match(line)
        if named:
            lines.append(f"-- {named['type'].lower()} {named['name']}")
            continue
        if line == "--":
            continue
        if not line and (not lines or not lines[-1]):
            continue  # one blank line between statements
        lines.append(line)
    while lines and not lines[-1]:
        lines.pop()
    return HEADER + "\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.schema_snapshot")
    parser.add_argument("--database-url", help="a PostgreSQL to migrate a throwaway schema in")
    parser.add_argument("--check", action="store_true", help="compare, do not write")
    args = parser.parse_args(argv)
    fresh = dump_fresh_schema(database_url(args.database_url))
    if args.check:
        if not SNAPSHOT.exists() or SNAPSHOT.read_text() != fresh:
            print("schema.sql is stale: run `make schema`", file=sys.stderr)
            return 1
        print("schema.sql matches migrations/")
        return 0
    SNAPSHOT.write_text(fresh)
    print(f"wrote {SNAPSHOT.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
