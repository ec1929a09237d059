"""schema.sql is exactly what migrating a schema from scratch produces (regenerate it with
`make schema` after adding a migration)."""

from __future__ import annotations

import shutil

import psycopg

from outbox.migrate import migrate
from scripts.schema_snapshot import SNAPSHOT, dump_fresh_schema, dump_schema
from tests.services import missing_service


def require_pg_dump() -> None:
    if shutil.which("pg_dump") is None:
        missing_service("pg_dump not found on PATH (the PostgreSQL client)")


def test_migrating_from_scratch_produces_exactly_schema_sql(database_url):
    require_pg_dump()
    fresh = dump_fresh_schema(database_url)
    assert fresh == SNAPSHOT.read_text(), "schema.sql is stale: run `make schema`"


def test_a_schema_change_the_snapshot_lacks_is_caught(database_url, schema):
    require_pg_dump()
    with psycopg.connect(database_url) as conn:
        migrate(conn, schema)
        conn.execute(f'CREATE INDEX ix_extra ON "{schema}".agent_action (workspace_id)')
        conn.commit()
    changed = dump_schema(database_url, schema)
    assert changed != SNAPSHOT.read_text()
    assert "CREATE INDEX ix_extra ON outbox.agent_action USING btree (workspace_id);" in changed


def test_the_snapshot_names_no_throwaway_schema_and_carries_no_dump_session_noise():
    text = SNAPSHOT.read_text()
    assert "schema_snapshot_" not in text
    for noise in ("SET search_path = ", "SET statement_timeout", "\\restrict", "Dumped by"):
        assert noise not in text
    assert "CREATE TABLE outbox.agent_action (" in text
