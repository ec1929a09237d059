"""Maintenance: each service does a bounded turn on its own interval, and a failing one is logged
and waits for its next turn without stopping the others or the claimer that runs them."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import redis
from prometheus_client import REGISTRY

from outbox import ActionKind, ActionRequest, StopReason, enqueue
from outbox.dispatch import Claimer, broker_from_url, install
from outbox.maintenance import (
    BacklogGauges,
    Expiry,
    LostLeases,
    Maintenance,
    Retention,
)
from outbox.store import Store
from outbox.testing import drain_async
from tests.support import ScriptedAdapter, rows

ONCE = ActionKind("MAINT_ONCE", at_most_once=True)
DAY = timedelta(days=1)
NOW = timedelta(0)


@pytest.fixture
def outbox(make_outbox):
    ob = make_outbox()
    ob.register(ONCE, ScriptedAdapter())
    ob.migrate()
    return ob


def put(ob, database_url, keys, **fields):
    with psycopg.connect(database_url) as conn:
        ids = [
            enqueue(
                conn,
                ActionRequest(
                    ONCE, lane_key=f"lane-{key}", idempotency_key=key, workspace_id="w", **fields
                ),
                schema=ob.schema,
            ).id
            for key in keys
        ]
        conn.commit()
    return ids


def sql(database_url, statement, params=()):
    """A test-only change with the guard trigger off (replica role, superuser)."""
    with psycopg.connect(database_url) as conn, conn.transaction():
        conn.execute("SET LOCAL session_replication_role = replica")
        conn.execute(statement, params)


def states(database_url, schema):
    with psycopg.connect(database_url) as conn:
        return {r["idempotency_key"]: (r["state"], r["stop_reason"]) for r in rows(conn, schema)}


def expire_waiting(database_url, schema, keys):
    sql(
        database_url,
        f"UPDATE \"{schema}\".agent_action SET expires_at = now() - interval '1 second'"
        " WHERE idempotency_key = ANY(%s)",
        (list(keys),),
    )


def soon():
    return datetime.now(UTC) + timedelta(minutes=5)


# -- lost leases -----------------------------------------------------------------------------------


async def test_lost_leases_end_uncertain_after_a_write_else_failed_a_bounded_number_a_turn(
    outbox, database_url, schema, caplog
):
    put(outbox, database_url, ["wrote", "last-1", "last-2"], max_attempts=1)
    put(outbox, database_url, ["may-run-again"], max_attempts=3)
    async with outbox.store() as store:
        claimed = await store.claim({ONCE.name: 10}, outbox.settings.lease)  # taken: attempt 1
        wrote = next(c.action for c in claimed if c.action.idempotency_key == "wrote")
        assert await store.begin_write(wrote.token, NOW)
        sql(database_url, f'UPDATE "{schema}".agent_action SET lease_until = now()')
        lost = LostLeases(NOW, limit=2)
        with caplog.at_level(logging.WARNING, logger="outbox.executor"):
            turns = [await lost.run(store), await lost.run(store), await lost.run(store)]
    assert turns == [2, 1, 0]
    assert states(database_url, schema) == {
        "wrote": ("UNCERTAIN", StopReason.LEASE_LOST_AFTER_WRITE),
        "last-1": ("FAILED", StopReason.ATTEMPTS_EXHAUSTED),
        "last-2": ("FAILED", StopReason.ATTEMPTS_EXHAUSTED),
        # Not this service's: the next claim reclaims it under a new epoch.
        "may-run-again": ("EXECUTING", None),
    }
    assert [r.message for r in caplog.records] == [
        f"action {wrote.id} of kind {ONCE.name} ended UNCERTAIN: LEASE_LOST_AFTER_WRITE"
    ]


# -- expiry ----------------------------------------------------------------------------------------


async def test_expiry_cancels_waiting_actions_past_their_expiry_a_bounded_number_a_turn(
    outbox, database_url, schema
):
    put(outbox, database_url, ["old-1", "old-2", "old-3", "later"], expires_at=soon())
    put(outbox, database_url, ["never"])
    expire_waiting(database_url, schema, ["old-1", "old-2", "old-3"])
    async with outbox.store() as store:
        expiry = Expiry(NOW, limit=2)
        assert [await expiry.run(store) for _ in range(3)] == [2, 1, 0]
    assert states(database_url, schema) == {
        "old-1": ("CANCELLED", StopReason.EXPIRED),
        "old-2": ("CANCELLED", StopReason.EXPIRED),
        "old-3": ("CANCELLED", StopReason.EXPIRED),
        "later": ("ADMITTED", None),
        "never": ("ADMITTED", None),
    }


# -- retention -------------------------------------------------------------------------------------


async def three_old_and_one_young(ob, database_url, schema):
    """Four actions run to their end: old-1..3 ended 31 days ago, young just now."""
    put(ob, database_url, ["old-1", "old-2", "old-3", "young"])
    await drain_async(ob)
    sql(
        database_url,
        f"UPDATE \"{schema}\".agent_action SET ended_at = now() - interval '31 days'"
        " WHERE idempotency_key LIKE 'old-%%'",
    )


async def test_retention_prunes_past_the_retention_at_most_its_batches_a_turn(
    outbox, database_url, schema
):
    await three_old_and_one_young(outbox, database_url, schema)
    async with outbox.store() as store:
        retention = Retention(NOW, 30 * DAY, batch_size=2, max_batches=1)
        assert [await retention.run(store) for _ in range(3)] == [2, 1, 0]
    assert list(states(database_url, schema)) == ["young"]


# -- backlog gauges --------------------------------------------------------------------------------


async def test_backlog_gauges_are_set_from_the_database(outbox, database_url):
    put(outbox, database_url, ["a", "b", "c"])
    async with outbox.store() as store:
        await BacklogGauges(NOW).run(store)
    assert REGISTRY.get_sample_value("outbox_actions_due", {"kind": ONCE.name}) == 3


# -- the runner ------------------------------------------------------------------------------------


async def test_each_service_takes_its_turn_on_its_own_interval(outbox, database_url, schema):
    async with outbox.store() as store:
        maintenance = Maintenance(store, [Expiry(NOW), BacklogGauges(timedelta(hours=1))])
        assert await maintenance.run_due() == 2
        put(outbox, database_url, ["late"], expires_at=soon())
        expire_waiting(database_url, schema, ["late"])
        assert await maintenance.run_due() == 1  # expiry only: the gauges' hour has not passed
    assert maintenance.turns == {"expiry": 2, "backlog_gauges": 1}
    assert states(database_url, schema) == {"late": ("CANCELLED", StopReason.EXPIRED)}


async def test_a_service_that_stopped_at_its_bound_goes_again_before_its_interval(
    outbox, database_url, schema
):
    await three_old_and_one_young(outbox, database_url, schema)
    async with outbox.store() as store:
        hourly = Retention(timedelta(hours=1), 30 * DAY, batch_size=2, max_batches=1)
        maintenance = Maintenance(store, [hourly, BacklogGauges(timedelta(hours=1))])
        assert await maintenance.run_due() == 2  # 2 pruned: its bound, so it is behind
        deadline = time.monotonic() + 5
        while await maintenance.run_due() == 0:  # back after about as long as its turn took
            assert time.monotonic() < deadline, "the pruning turn waited for its hour"
            await asyncio.sleep(0.01)
        assert maintenance.turns == {"retention": 2, "backlog_gauges": 1}
        await asyncio.sleep(0.2)
        # The last old action went in a turn below the bound: the next waits for the hour.
        assert await maintenance.run_due() == 0
    assert list(states(database_url, schema)) == ["young"]


async def test_a_failing_service_is_logged_and_waits_its_turn_while_the_others_run(
    outbox, database_url, schema, caplog
):
    put(outbox, database_url, ["gone"], expires_at=soon())
    expire_waiting(database_url, schema, ["gone"])
    async with outbox.store() as store:
        # A negative retention makes every prune raise (a real ConfigurationError).
        broken = Retention(timedelta(hours=1), timedelta(days=-1))
        maintenance = Maintenance(store, [broken, Expiry(NOW)])
        with caplog.at_level(logging.ERROR, logger="outbox.housekeeping"):
            assert await maintenance.run_due() == 2
            assert await maintenance.run_due() == 1  # the failed one waits for its hour
    assert states(database_url, schema) == {"gone": ("CANCELLED", StopReason.EXPIRED)}
    assert maintenance.failures == {"retention": 1, "expiry": 0}
    assert [(r.message, r.exc_info is not None) for r in caplog.records] == [
        ("prune failed; trying again at the next housekeeping", True)
    ]


@pytest.fixture
def clean_redis(redis_url: str, schema: str):
    yield
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"*{schema}*"):
        client.delete(key)


async def test_a_claimer_whose_maintenance_fails_still_claims_and_pushes(
    outbox, database_url, schema, redis_url, clean_redis, caplog
):
    put(outbox, database_url, ["due-1", "due-2"])
    dispatch = install(outbox, broker_from_url(redis_url))
    async with outbox.store() as store:
        claimer = Claimer(dispatch, store)
        # Every service's statements fail (a schema that does not exist: UndefinedTable).
        missing = Store(store.pool, f"{schema}_missing", store.lease)
        claimer.maintenance = Maintenance.for_claimer(missing, outbox.settings)
        with caplog.at_level(logging.ERROR, logger="outbox.housekeeping"):
            result = await claimer.run_once()
    assert result.pushed == 2
    assert claimer.totals["housekeeping"] == 1
    services = [
        "lost_leases",
        "expiry",
        "retention",
        "parked_payloads",
        "stale_processes",
        "backlog_gauges",
    ]
    assert claimer.maintenance.failures == dict.fromkeys(services, 1)
    assert len(caplog.records) == len(services)


async def test_a_claimer_round_runs_every_service(
    outbox: Any, database_url, schema, redis_url, clean_redis
):
    put(outbox, database_url, ["old"])
    await drain_async(outbox)
    sql(
        database_url,
        f"UPDATE \"{schema}\".agent_action SET ended_at = now() - interval '31 days'",
    )
    put(outbox, database_url, ["lost"], max_attempts=1)
    async with outbox.store() as store:
        await store.claim({ONCE.name: 1}, outbox.settings.lease)
    sql(database_url, f'UPDATE "{schema}".agent_action SET lease_until = now()')
    put(outbox, database_url, ["expired"], expires_at=soon())
    expire_waiting(database_url, schema, ["expired"])
    put(outbox, database_url, ["due"])
    dispatch = install(outbox, broker_from_url(redis_url))
    async with outbox.store() as store:
        claimer = Claimer(dispatch, store)
        result = await claimer.run_once()
    assert [c.action.idempotency_key for c in result.claimed] == ["due"]
    assert states(database_url, schema) == {
        # "old" pruned; the gauges read before the claim: "due" was due.
        "lost": ("FAILED", StopReason.ATTEMPTS_EXHAUSTED),
        "expired": ("CANCELLED", StopReason.EXPIRED),
        "due": ("EXECUTING", None),
    }
    assert REGISTRY.get_sample_value("outbox_actions_due", {"kind": ONCE.name}) == 1
