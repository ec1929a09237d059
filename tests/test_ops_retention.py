"""Retention: exactly the actions ended more than the retention ago are deleted, in batches that
never make a claim (or another prune) wait."""

from __future__ import annotations

import asyncio
import json
import time
from datetime import timedelta

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, ActionState, ConfigurationError, Settings, enqueue
from outbox.cli import main
from outbox.retention import prune, prune_async, prune_batch_operation
from outbox.testing import drain
from tests.support import ScriptedAdapter, rows

NOTE = ActionKind("NOTE")
DAY = timedelta(days=1)


@pytest.fixture
def outbox(make_outbox):
    ob = make_outbox()
    ob.register(NOTE, ScriptedAdapter())
    ob.migrate()
    return ob


def put(conn, schema, key, lane=None, **fields):
    request = ActionRequest(
        NOTE, lane_key=lane or f"lane-{key}", idempotency_key=key, workspace_id="w", **fields
    )
    action = enqueue(conn, request, schema=schema)
    conn.commit()
    return action.id


def end_ago(conn, schema, ages: dict[int, timedelta]) -> None:
    """Moves ended_at of ended actions into the past. The guard trigger refuses any change to an
    ended row, so this test-only backdating runs with triggers off (replica role, superuser)."""
    with conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        for action_id, age in ages.items():
            conn.execute(
                f'UPDATE "{schema}".agent_action SET ended_at = now() - %s WHERE id = %s',
                (age, action_id),
            )


def ended_fixture(outbox, database_url, ages: list[timedelta]) -> list[int]:
    """One ended (DONE) action per age, ended that long ago; returns their ids in that order."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        ids = [put(conn, outbox.schema, f"old-{i}") for i in range(len(ages))]
        drain(outbox)
        end_ago(conn, outbox.schema, dict(zip(ids, ages, strict=True)))
    return ids


def test_prune_deletes_exactly_the_actions_ended_more_than_the_retention_ago(
    outbox, database_url, schema
):
    retention = Settings().retention  # the default, 30 days
    ages = [31 * DAY, 90 * DAY, retention + timedelta(minutes=1), retention - timedelta(minutes=1),
            29 * DAY, timedelta(0)]  # fmt: skip
    ids = ended_fixture(outbox, database_url, ages)
    with psycopg.connect(database_url) as conn:
        waiting = put(conn, schema, "waiting", proposal=True)  # not ended: never pruned
        deleted = prune(conn, retention, schema=schema, batch_size=2)
        left = rows(conn, schema)
    assert deleted == 3
    assert [r["id"] for r in left] == [*ids[3:], waiting]
    assert {r["state"] for r in left} == {"DONE", "PROPOSED"}


def test_prune_cli_uses_the_given_retention_and_reports_json(outbox, database_url, schema, capsys):
    ids = ended_fixture(outbox, database_url, [10 * DAY, 3 * DAY])
    code = main(
        ["prune", "--database-url", database_url, "--schema", schema, "--retention-days", "5",
         "--batch-size", "1", "--json", "--yes"]
    )  # fmt: skip
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report == {"pruned": 1, "retention_seconds": 5 * 86400.0}
    with psycopg.connect(database_url) as conn:
        assert [r["id"] for r in rows(conn, schema)] == [ids[1]]


def test_housekeeping_prune_is_bounded_by_max_batches(outbox, database_url, schema):
    ended_fixture(outbox, database_url, [40 * DAY] * 5)

    async def run() -> list[int]:
        async with outbox.store() as store:
            first = await prune_async(store, 30 * DAY, batch_size=2, max_batches=1)
            rest = await prune_async(store, 30 * DAY, batch_size=2)
            return [first, rest]

    assert asyncio.run(run()) == [2, 3]


def test_a_claim_is_not_blocked_by_a_prune_in_progress(outbox, database_url, schema):
    # Old ended actions in the very lane whose next action is due now.
    with psycopg.connect(database_url, autocommit=True) as conn:
        old = [put(conn, schema, f"old-{i}", lane="shared") for i in range(3)]
        drain(outbox)
        end_ago(conn, schema, {i: 40 * DAY for i in old})
        due = put(conn, schema, "due", lane="shared")

    with psycopg.connect(database_url) as pruner:
        # The prune's batch deleted its rows and holds their locks until it commits.
        deleted = pruner.execute(prune_sql(schema), {"retention": 30 * DAY, "limit": 100})
        assert len(deleted.fetchall()) == 3

        async def claim_while_prune_is_open():
            async with outbox.store() as store:
                started = time.monotonic()
                claim = store.claim({"NOTE": 10}, outbox.settings.lease)
                claimed = await asyncio.wait_for(claim, 5)
                return claimed, time.monotonic() - started

        claimed, took = asyncio.run(claim_while_prune_is_open())
        assert [c.action.id for c in claimed] == [due]
        assert took < 2.0
        # A new enqueue of the lane does not wait either.
        with psycopg.connect(database_url, autocommit=True) as other:
            other.execute("SET lock_timeout = '2s'")
            put(other, schema, "new-in-lane", lane="shared")
        pruner.commit()

    with psycopg.connect(database_url) as conn:
        left = {r["id"]: r["state"] for r in rows(conn, schema)}
        assert left[due] == "EXECUTING"
        assert not set(old) & set(left)


def test_prune_skips_rows_others_hold_instead_of_waiting(outbox, database_url, schema):
    ids = ended_fixture(outbox, database_url, [40 * DAY] * 4)
    with psycopg.connect(database_url) as holder, psycopg.connect(database_url) as conn:
        holder.execute(f'SELECT 1 FROM "{schema}".agent_action WHERE id = %s FOR UPDATE', [ids[0]])
        conn.execute("SET lock_timeout = '2s'")  # a prune that waited would fail here
        conn.commit()
        started = time.monotonic()
        assert prune(conn, 30 * DAY, schema=schema) == 3
        assert time.monotonic() - started < 2.0
        holder.rollback()
        assert prune(conn, 30 * DAY, schema=schema) == 1
        assert rows(conn, schema) == []


def test_prune_refuses_a_negative_retention_and_an_open_transaction(outbox, database_url, schema):
    with psycopg.connect(database_url) as conn:
        with pytest.raises(ConfigurationError):
            prune(conn, timedelta(days=-1), schema=schema)
        conn.execute("SELECT 1")  # a transaction is now open
        with pytest.raises(ConfigurationError, match="outside a transaction"):
            prune(conn, 30 * DAY, schema=schema)


def prune_sql(schema: str) -> str:
    op = prune_batch_operation(schema, DAY, 1)
    return next(op).sql


def test_ended_state_is_required_for_pruning(outbox, database_url, schema):
    # A live action older than the retention (created long ago) is never pruned.
    with psycopg.connect(database_url) as conn:
        live = put(conn, schema, "live")
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                f'UPDATE "{schema}".agent_action SET created_at = now() - %s WHERE id = %s',
                (400 * DAY, live),
            )
        assert prune(conn, timedelta(0), schema=schema) == 0
        (row,) = rows(conn, schema)
        assert row["state"] == ActionState.ADMITTED
