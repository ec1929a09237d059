"""The statements every claim and every attempt runs are planned once a connection.

A claim of 100 took 2.5 to 5 ms to plan and a batch's finish about 2 ms, against 5 to 9 ms to
run: left to PostgreSQL's choice (``plan_cache_mode = auto``), each was planned anew on its first
runs on every connection (psycopg's five runs before it prepares, then the server's five custom
plans), and a batched finish on most runs after. A claimer's claims (its rounds' transactions), an
in-process claim (its transaction) and a worker's pool (``Outbox.store(generic_plans=True)``)
prepare them at their first run and plan them generically: one plan a connection, the one the
lane and claim plans are written and tested for (``tests/test_core_lane_plans.py``).
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row
from psycopg_pool import AsyncConnectionPool

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import run_async
from outbox.dispatch.claim_guard import close_claim_round, open_claim_round
from outbox.dispatch.claimer import plan_claim_round
from outbox.dispatch.consumption import ConsumptionWatch
from outbox.results import Finish
from outbox.state import ActionState

NOTE = ActionKind("NOTE")
LEASE = timedelta(minutes=5)
#: Fewer runs a connection than psycopg's ``prepare_threshold`` (5): prepared at the first.
RUNS = 3


def _enqueue(conn: psycopg.Connection, schema: str, prefix: str, n: int) -> None:
    requests = [
        ActionRequest(
            NOTE, lane_key=f"{prefix}{i}", idempotency_key=f"{prefix}{i}", workspace_id="w"
        )
        for i in range(n)
    ]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()


#: How ``claim_heads`` begins: its prepared statement is found by it.
CLAIM_HEADS = "WITH RECURSIVE outage AS"


async def _plans(conn: psycopg.AsyncConnection[Any], *markers: str) -> dict[str, dict[str, Any]]:
    """This session's prepared statements whose text holds each marker: how often each ran on
    a generic plan and how often on a custom one."""
    async with conn.cursor(row_factory=dict_row) as cur:
        await cur.execute(
            "SELECT statement, generic_plans, custom_plans FROM pg_prepared_statements"
        )
        rows = await cur.fetchall()
    found = {}
    for marker in markers:
        matching = [row for row in rows if marker in row["statement"]]
        assert matching, f"no prepared statement holds {marker!r}"
        found[marker] = {
            "statements": len(matching),
            "generic_plans": sum(row["generic_plans"] for row in matching),
            "custom_plans": sum(row["custom_plans"] for row in matching),
        }
    return found


async def test_a_workers_pool_prepares_an_attempts_statements_and_plans_them_once(
    make_outbox, conn, schema
) -> None:
    ob = make_outbox(pool_size=1)
    ob.declare(NOTE)
    ob.migrate()
    _enqueue(conn, schema, "l", RUNS)
    async with ob.store() as claiming:
        claimed = await claiming.claim({NOTE.name: RUNS}, LEASE, take=False)
    assert len(claimed) == RUNS
    async with ob.store(generic_plans=True) as store:
        for item in claimed:
            token = item.action.token
            assert await store.take_attempt(token) is not None
            assert await store.begin_write(token, timedelta(0))
            assert await store.finish(
                token, Finish(ActionState.DONE, stop_reason="DONE"), fenced=True
            )
        async with store.connection() as session:
            plans = await _plans(session, "SET taken_epoch = a.epoch", "fenced AS", "finished AS")
    for marker, counts in plans.items():
        assert counts["custom_plans"] == 0, (marker, counts)
        assert counts["generic_plans"] >= RUNS, (marker, counts)


async def _prepared(conn: psycopg.AsyncConnection[Any]) -> dict[str, int]:
    """This session's prepared statements: how often each ran (on any plan), by name."""
    async with conn.cursor() as cur:
        await cur.execute("SELECT name, generic_plans + custom_plans FROM pg_prepared_statements")
        return {name: runs for name, runs in await cur.fetchall()}


async def test_the_warm_up_prepares_the_statements_a_connections_attempts_then_run(
    make_outbox, conn, schema
) -> None:
    """A single take, fence and finish, then batches of each: every statement they ran is one
    the new connection's warm-up prepared (same text, same parameter types), so none of them is
    parsed or planned again."""
    ob = make_outbox(pool_size=1)
    ob.declare(NOTE)
    ob.migrate()
    _enqueue(conn, schema, "w", 4)
    async with ob.store() as claiming:
        claimed = await claiming.claim({NOTE.name: 4}, LEASE, take=False)
    tokens = [item.action.token for item in claimed]
    assert len(tokens) == 4
    claimed_at = datetime.now(UTC)
    done = Finish(ActionState.DONE, stop_reason="DONE")
    async with ob.store(generic_plans=True) as store:
        async with store.connection() as session:
            warmed = await _prepared(session)
        alone, batch = tokens[0], tokens[1:]
        assert await store.take_attempt(alone) is not None
        assert await store.begin_write(alone, timedelta(0), claimed_at=claimed_at)
        assert await store.finish(alone, done, claimed_at, fenced=True)
        assert all(await asyncio.gather(*(store.take_attempt(t) for t in batch)))
        assert all(
            await asyncio.gather(
                *(store.begin_write(t, timedelta(0), "ref", claimed_at) for t in batch)
            )
        )
        assert all(
            await asyncio.gather(*(store.finish(t, done, claimed_at, fenced=True) for t in batch))
        )
        batched = {w.name: w.statements for w in store.group_writers}
        async with store.connection() as session:
            after = await _prepared(session)
    # The batches went as batches (one statement of three, or of two and one).
    assert all(statements <= 3 for statements in batched.values()), batched
    assert set(after) == set(warmed), "an attempt prepared a statement of its own"
    ran = sum(after.values()) - sum(warmed.values())
    assert ran >= 3 + 3, (warmed, after)


async def test_a_claimers_rounds_plan_their_claim_once_a_connection(
    make_outbox, conn, schema
) -> None:
    ob = make_outbox(pool_size=1)
    ob.declare(NOTE)
    ob.migrate()
    watch, cursor = ConsumptionWatch(), {}
    async with ob.store() as store, store.connection() as session:
        for i in range(RUNS):
            _enqueue(conn, schema, f"r{i}-", 1)
            op = plan_claim_round(
                schema, [NOTE.name], 64, 96, LEASE, watch, None, cursor, locked=True
            )
            rows = await open_claim_round(session, schema, ob.settings, next(op))
            plan = await run_async(session, op, started=rows)
            answers = await close_claim_round(session, plan.statements)
            assert len(plan.settle(answers, watch, cursor).claimed) == 1
        plans = await _plans(session, CLAIM_HEADS)
    # Every claim ran on the one generic plan of the statement the pool's warm-up prepared
    # (and ran once, on a plan of its own, before the connection served).
    counts = plans[CLAIM_HEADS]
    assert counts["generic_plans"] == RUNS, counts
    assert counts["statements"] == 1, counts


async def test_an_in_process_claim_is_planned_once_a_connection(make_outbox, conn, schema) -> None:
    ob = make_outbox(pool_size=1)
    ob.declare(NOTE)
    ob.migrate()
    async with ob.store() as store:
        for i in range(RUNS):
            _enqueue(conn, schema, f"p{i}-", 1)
            assert len(await store.claim({NOTE.name: 10}, LEASE)) == 1
        async with store.connection() as session:
            plans = await _plans(session, CLAIM_HEADS)
    # Every claim ran on the one generic plan of the statement the pool's warm-up prepared.
    counts = plans[CLAIM_HEADS]
    assert counts["generic_plans"] == RUNS, counts
    assert counts["statements"] == 1, counts


async def test_generic_plans_beside_a_pool_of_the_callers_is_refused_not_ignored(
    make_outbox,
) -> None:
    ob = make_outbox(pool_size=1)
    pool = AsyncConnectionPool(ob.settings.require_database_url(), min_size=1, open=False)
    with pytest.raises(ValueError, match="plan_cache_mode=force_generic_plan"):
        async with ob.store(pool, generic_plans=True):
            pass
