"""``outbox demo`` never drops a schema it did not create: only its own marked schema, holding
only actions it enqueued, is dropped and created anew; any other is refused and left intact."""

from __future__ import annotations

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, enqueue
from outbox.cli import main
from outbox.demo.schema import (
    DEMO_SCHEMA,
    DemoSchemaRefused,
    fresh_demo_schema,
    record_demo_actions,
)
from outbox.outbox import Outbox

NOTE = ActionKind("NOTE")


def _outbox(database_url: str, schema: str) -> Outbox:
    ob = Outbox(database_url, schema=schema)
    ob.declare(NOTE)
    ob.migrate()
    return ob


def _enqueue(database_url: str, schema: str, key: str, *, as_demo: bool = False) -> int:
    with psycopg.connect(database_url) as conn:
        action = enqueue(
            conn,
            ActionRequest(NOTE, lane_key="l", idempotency_key=key, workspace_id="w"),
            schema=schema,
        )
        if as_demo:
            record_demo_actions(conn, schema, [action.id])
        conn.commit()
    return action.id


def _keys(database_url: str, schema: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            f'SELECT idempotency_key FROM "{schema}".agent_action ORDER BY id'
        ).fetchall()
    return [k for (k,) in found]


def test_the_default_is_a_schema_of_the_demos_own():
    assert DEMO_SCHEMA == "outbox_demo"
    args = __import__("outbox.cli", fromlist=["build_parser"]).build_parser().parse_args(["demo"])
    assert args.schema == DEMO_SCHEMA


def test_a_schema_without_the_mark_holding_actions_is_refused_and_left_intact(
    database_url, schema, monkeypatch, capsys
):
    _outbox(database_url, schema)  # the schema claimers and workers use, migrated
    _enqueue(database_url, schema, "the-applications")
    with pytest.raises(DemoSchemaRefused) as refused:
        fresh_demo_schema(database_url, schema)
    assert str(refused.value) == (
        f"schema {schema} exists and was not created by outbox demo (it holds 1 actions): the "
        "demo never drops it; run the demo in a schema of its own: outbox demo --schema NAME"
    )
    # Through the command, as `docker compose run --rm demo` would run it: one line, status 1.
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database_url)
    assert main(["demo", "--schema", schema, "--people", "3", "--timeout", "5"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == f"outbox demo: {refused.value}"
    assert _keys(database_url, schema) == ["the-applications"]


def test_a_schema_without_the_mark_and_without_actions_is_refused_too(database_url, schema):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
        conn.execute(f'CREATE TABLE "{schema}".orders (id int)')
    with pytest.raises(DemoSchemaRefused, match="it may be in use"):
        fresh_demo_schema(database_url, schema)
    with psycopg.connect(database_url) as conn:
        assert conn.execute(f'SELECT count(*) FROM "{schema}".orders').fetchone() == (0,)


def test_the_demos_own_schema_is_dropped_and_created_anew(database_url, schema):
    fresh_demo_schema(database_url, schema)  # does not exist yet: created and marked
    _outbox(database_url, schema)
    _enqueue(database_url, schema, "the-demos", as_demo=True)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{schema}".leftover (id int)')
    fresh_demo_schema(database_url, schema)
    with psycopg.connect(database_url) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (schema,)
        ).fetchall()
    assert tables == [("outbox_demo_action",)]  # emptied: a new run starts from nothing


def test_a_demo_schema_somebody_enqueued_into_is_refused_and_left_intact(database_url, schema):
    fresh_demo_schema(database_url, schema)
    _outbox(database_url, schema)
    _enqueue(database_url, schema, "the-demos", as_demo=True)
    _enqueue(database_url, schema, "somebody-elses")
    with pytest.raises(DemoSchemaRefused) as refused:
        fresh_demo_schema(database_url, schema)
    assert str(refused.value).startswith(
        f"schema {schema} holds 1 actions the demo did not enqueue: the demo never drops it"
    )
    assert _keys(database_url, schema) == ["the-demos", "somebody-elses"]


def test_a_comment_alone_is_not_the_mark(database_url, schema):
    """Somebody's schema that happens to carry the demo's comment but not its table of actions
    (a hand-made copy, say) is not the demo's."""
    from outbox.demo.schema import MARK

    _outbox(database_url, schema)
    _enqueue(database_url, schema, "the-applications")
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"COMMENT ON SCHEMA \"{schema}\" IS '{MARK}'")
    with pytest.raises(DemoSchemaRefused, match="not created by outbox demo"):
        fresh_demo_schema(database_url, schema)
    assert _keys(database_url, schema) == ["the-applications"]
