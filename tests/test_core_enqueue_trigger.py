"""The insert trigger, as an enqueue pays for it: no setting changed at a call, nothing resolved
through the caller's search_path, and a kind's deletion still seen by an enqueue that waited
for it."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, enqueue, enqueue_many

NOTE = ActionKind("NOTE")
GONE = ActionKind("GONE")


@pytest.fixture
def outbox(make_outbox):
    ob = make_outbox()
    ob.declare(NOTE, GONE)
    ob.migrate()
    return ob


@pytest.fixture
def decoy(database_url: str, schema: str) -> Iterator[str]:
    """A schema whose tables and functions bear the outbox's names, empty and refusing: a
    trigger that resolved a name through the caller's search_path would land here."""
    name = f"{schema}_decoy"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
        conn.execute(f'CREATE TABLE "{name}".agent_action_kind (name text, instance_level bool)')
        conn.execute(
            f'CREATE TABLE "{name}".agent_action_lane_intake'
            " (lane_key text, lane_keys text[], lanes int, priority smallint)"
        )
        conn.execute(
            f'CREATE FUNCTION "{name}".agent_action_notify_off(text) RETURNS boolean'
            " LANGUAGE sql AS 'SELECT true'"
        )
    try:
        yield name
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def rows(conn: psycopg.Connection, query: str) -> list[tuple]:
    return conn.execute(query).fetchall()


def request(key: str, lane: str | None = None, kind: ActionKind = NOTE) -> ActionRequest:
    return ActionRequest(
        kind=kind, workspace_id="w", lane_key=lane or f"lane-{key}", idempotency_key=key
    )


def test_the_insert_trigger_changes_no_setting_at_a_call(outbox, conn, schema):
    # A function's SET clause is applied and undone at every call (with the schema list
    # recomputed): about 12 us of a one-action enqueue. The trigger names its schema instead.
    config = conn.execute(
        "SELECT p.proconfig FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace"
        " WHERE n.nspname = %s AND p.proname = 'agent_action_inserted'",
        (schema,),
    ).fetchone()
    assert config == (None,)


@pytest.mark.parametrize("search_path", ["decoy", "empty"])
def test_the_insert_trigger_reads_and_writes_its_own_schema_whatever_the_callers_path(
    outbox, database_url, schema, decoy, search_path
):
    path = f'"{decoy}"' if search_path == "decoy" else "''"
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "outbox_{schema}"')
        with psycopg.connect(database_url) as app:
            app.execute(f"SET search_path = {path}")
            enqueue(app, request("one"), schema=schema)
            enqueue_many(app, [request("a", "x"), request("b", "y")], schema=schema)
            enqueue_many(app, [request("c", "z"), request("d", "z", GONE)], schema=schema)
            app.commit()
        assert len(list(listener.notifies(timeout=2, stop_after=1))) == 1
    with psycopg.connect(database_url) as conn:
        intake = rows(
            conn,
            f'SELECT lane_key, lane_keys FROM "{schema}".agent_action_lane_intake ORDER BY seq',
        )
        assert intake == [("lane-one", None), (None, ["x", "y"]), ("z", None)]
        assert rows(conn, f'SELECT count(*) FROM "{decoy}".agent_action_lane_intake') == [(0,)]


@pytest.mark.parametrize(
    "batch",
    [
        [("k1", "l1")],  # one action: the common statement
        [("k1", "l1"), ("k2", "l1")],  # one kind, one lane
        [("k1", "l1"), ("k2", "l2")],  # one kind, two lanes
    ],
    ids=["one-action", "one-lane", "two-lanes"],
)
def test_an_enqueue_that_waited_for_its_kinds_deletion_is_refused(
    outbox, database_url, schema, batch
):
    # The deletion holds the kind's lock; the enqueue's insert queues behind it, then must see
    # the kind gone (its read of the kind comes after the lock), not accept an action of it.
    errors: list[BaseException] = []
    with psycopg.connect(database_url) as deleting:
        deleting.execute(f'DELETE FROM "{schema}".agent_action_kind WHERE name = %s', (GONE.name,))

        def enqueue_gone() -> None:
            with psycopg.connect(database_url) as app:
                try:
                    enqueue_many(app, [request(k, lane, GONE) for k, lane in batch], schema=schema)
                    app.commit()
                except BaseException as error:  # the assertion below reads it
                    errors.append(error)

        thread = threading.Thread(target=enqueue_gone)
        thread.start()
        waiting = _wait_for_lock_wait(deleting, database_url)
        assert waiting, "the enqueue never queued behind the deletion's lock"
        deleting.commit()
        thread.join(timeout=10)
    assert not thread.is_alive()
    assert len(errors) == 1, errors
    assert isinstance(errors[0], psycopg.errors.ForeignKeyViolation), errors
    assert "is not present" in str(errors[0].diag.message_detail)
    with psycopg.connect(database_url) as conn:
        assert rows(conn, f'SELECT count(*) FROM "{schema}".agent_action') == [(0,)]
        assert rows(conn, f'SELECT count(*) FROM "{schema}".agent_action_lane_intake') == [(0,)]


def _wait_for_lock_wait(holder: psycopg.Connection, database_url: str) -> bool:
    """Whether some backend comes to wait on an advisory lock ``holder`` holds (within 10 s)."""
    with psycopg.connect(database_url, autocommit=True) as watch:
        for _ in range(200):
            blocked = watch.execute(
                "SELECT count(*) FROM pg_stat_activity"
                " WHERE %s = ANY (pg_blocking_pids(pid)) AND wait_event = 'advisory'",
                (holder.info.backend_pid,),
            ).fetchone()
            if blocked and blocked[0]:
                return True
            threading.Event().wait(0.05)
    return False
