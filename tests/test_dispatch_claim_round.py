"""What a dispatch claim round sends and waits for: no claim statement for a kind with nothing
to claim, so a claimer serving many kinds pays for the ones with work, not for every kind it
serves; and no wait for a housekeeping turn, which runs beside the rounds."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Generator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import pq

from benchmarks.chaos.servers import PrivatePostgres, missing_binaries
from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import Statement, run_async
from outbox.dispatch import Claimer, broker_from_url, install
from outbox.dispatch.claim_guard import close_claim_round, open_claim_round
from outbox.dispatch.claimer import Round, bounded_claim_operation, plan_claim_round
from outbox.dispatch.consumption import ConsumptionWatch
from outbox.maintenance.runner import Maintenance
from outbox.maintenance.service import MaintenanceService
from outbox.queries import queries_for
from tests.apps import dispatch_app
from tests.services import missing_service

BUSY = ActionKind("BUSY")
IDLE = [ActionKind(f"IDLE_{i}") for i in range(5)]


def _recording(op: Generator[Statement, Any, Round], sent: list[str], names: dict[str, str]):
    """Runs ``op``, noting the name of each statement it sends."""
    statement = next(op)
    while True:
        sent.append(names[statement.sql])
        rows = yield statement
        try:
            statement = op.send(rows)
        except StopIteration as done:
            return done.value


def _round(ob, schema: str, kinds: list[str], lease: timedelta) -> tuple[Round, list[str]]:
    names = {sql: name for name, sql in queries_for(schema).items()}
    sent: list[str] = []

    async def go() -> Round:
        async with ob.store() as store, store.connection() as c, c.transaction():
            op = bounded_claim_operation(
                schema, kinds, 64, 100, lease, ConsumptionWatch(), locked=True
            )
            return await run_async(c, _recording(op, sent, names))

    return asyncio.run(go()), sent


def test_a_round_sends_claim_statements_only_for_kinds_with_work(make_outbox, conn, schema) -> None:
    ob = make_outbox()
    for kind in (BUSY, *IDLE):
        ob.declare(kind)
    ob.migrate()
    kinds = sorted(k.name for k in (BUSY, *IDLE))
    enqueue_many(
        conn,
        [
            ActionRequest(BUSY, lane_key=f"l{i}", idempotency_key=f"k{i}", workspace_id="w")
            for i in range(3)
        ],
        schema=schema,
    )
    conn.commit()

    claimed, sent = _round(ob, schema, kinds, timedelta(seconds=1))
    assert len(claimed.claimed) == 3
    # One look, then the busy kind's claim; nothing at all for the five idle kinds (before: a
    # claim statement each).
    assert sent == ["claim_round_state", "claim_heads"], sent

    idle, sent = _round(ob, schema, kinds, timedelta(seconds=1))
    assert idle.claimed == [] and sent == ["claim_round_state"], sent

    time.sleep(1.2)  # the three leases run out unconsumed: the next round reclaims them
    probe, sent = _round(ob, schema, kinds, timedelta(seconds=30))
    assert len(probe.claimed) == 1  # a probe: no worker took the last claims
    assert sent == ["claim_round_state", "claim_heads"], sent


class _SlowTurn(MaintenanceService):
    """A maintenance service whose turn takes ``seconds`` (a slow prune on a big table)."""

    name = "slow"
    failure = "the slow turn failed"

    def __init__(self, seconds: float) -> None:
        super().__init__(timedelta(0))
        self.seconds = seconds
        self.started = asyncio.Event()

    async def run(self, store: Any) -> int:
        self.started.set()
        await asyncio.sleep(self.seconds)
        return 0


async def test_a_woken_round_never_waits_for_a_housekeeping_turn(
    make_outbox, schema: str, redis_url: str
) -> None:
    url = make_outbox().settings.require_database_url()
    outbox = dispatch_app.build(url, schema, schema.upper(), poll_interval=timedelta(seconds=30))
    outbox.migrate()
    rb, _ = dispatch_app.kinds(schema.upper())
    dispatch = install(outbox, broker_from_url(redis_url))
    stop = asyncio.Event()
    slow = _SlowTurn(seconds=4.0)

    def enqueue() -> None:
        with psycopg.connect(url) as conn:
            request = ActionRequest(rb, lane_key="l", idempotency_key="k", workspace_id="w")
            outbox.enqueue(conn, request)

    async with outbox.store() as store:
        claimer = Claimer(dispatch, store)
        claimer.maintenance = Maintenance(store, [slow])
        running = asyncio.create_task(claimer.run(stop))
        try:
            await asyncio.wait_for(slow.started.wait(), 5)
            await asyncio.sleep(0.2)  # the claimer is waiting for a wake, its housekeeping busy
            woken = time.monotonic()
            await asyncio.to_thread(enqueue)
            while claimer.totals["pushed"] < 1:
                assert time.monotonic() - woken < 2.0, "the round waited for the housekeeping"
                await asyncio.sleep(0.02)
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)


def _round_trips(trace: str) -> list[list[str]]:
    """What the client sent that the server answered, from a libpq trace: each run of messages
    the client sent before the next answer (their types; a simple query with its text)."""
    flights: list[list[str]] = []
    answered = True
    for line in trace.splitlines():
        fields = line.split("\t")
        if len(fields) < 3 or fields[0] not in ("F", "B"):
            continue  # a simple query's text goes on over several lines
        if fields[0] == "B":
            answered = True
            continue
        if answered:
            flights.append([])
            answered = False
        flights[-1].append(fields[3].strip() if fields[2] == "Query" else fields[2])
    return flights


async def test_a_claimer_round_is_two_round_trips_however_many_kinds_claim(
    make_outbox, schema: str, redis_url: str, tmp_path
) -> None:
    url = make_outbox().settings.require_database_url()
    outbox = dispatch_app.build(url, schema, schema.upper())
    outbox.migrate()
    kinds = dispatch_app.kinds(schema.upper())
    with psycopg.connect(url) as conn:
        for n, kind in enumerate(kinds):
            request = ActionRequest(
                kind, lane_key=f"l{n}", idempotency_key=f"k{n}", workspace_id="w"
            )
            outbox.enqueue(conn, request)
    dispatch = install(outbox, broker_from_url(redis_url))
    trace = tmp_path / "trace"
    async with outbox.store() as store:
        pooled = store.connection

        @contextlib.asynccontextmanager
        async def traced():
            async with pooled() as conn:
                with open(trace, "w") as out:
                    conn.pgconn.trace(out.fileno())
                    conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)
                    try:
                        yield conn
                    finally:
                        conn.pgconn.untrace()

        store.connection = traced  # type: ignore[method-assign]
        claimer = Claimer(dispatch, store)
        claimed = await claimer.claim()
        assert sorted(c.action.kind for c in claimed.claimed) == sorted(k.name for k in kinds)
        sent = _round_trips(trace.read_text())
        # The opening (BEGIN, the bounds and the lock, the first look) as one simple query, then
        # both kinds' claims and the COMMIT as one pipeline (before: a round trip a claim, and
        # one more for the COMMIT).
        assert len(sent) == 2, sent
        assert sent[0][0].startswith('"BEGIN;'), sent
        assert sent[1].count("Execute") == len(kinds) + 1, sent  # the claims and the COMMIT
        with psycopg.connect(url) as other:
            held = other.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 2830"
            ).fetchone()
            executing = other.execute(
                f'SELECT count(*) FROM "{schema}".agent_action WHERE state = %s', ["EXECUTING"]
            ).fetchone()
        assert held == (0,), "the claim lock outlived the round"
        assert executing == (len(kinds),), "the claims were not committed"


async def test_a_claim_that_fails_in_the_closing_round_trip_ends_the_round_there(
    make_outbox, schema: str, redis_url: str
) -> None:
    url = make_outbox().settings.require_database_url()
    outbox = dispatch_app.build(url, schema, schema.upper())
    outbox.migrate()
    rb, _ = dispatch_app.kinds(schema.upper())
    with psycopg.connect(url) as conn:
        outbox.enqueue(conn, ActionRequest(rb, lane_key="l", idempotency_key="k", workspace_id="w"))
    settings = outbox.settings
    async with outbox.store() as store, store.connection() as conn:
        op = plan_claim_round(
            schema, [rb.name], 64, 100, timedelta(seconds=30), ConsumptionWatch(), locked=True
        )
        rows = await open_claim_round(conn, schema, settings, next(op))
        plan = await run_async(conn, op, started=rows)
        assert len(plan.statements) == 1
        failing = Statement("SELECT 1 / %(zero)s::int", {"zero": 0})
        with pytest.raises(psycopg.errors.DivisionByZero):
            await close_claim_round(conn, [*plan.statements, failing])
        # No ROLLBACK from the claimer yet (it might be paused or cut off right here): the
        # round's transaction is already over, its lock free and its claim undone.
        assert conn.info.transaction_status == pq.TransactionStatus.IDLE
        with psycopg.connect(url) as other:
            held = other.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 2830"
            ).fetchone()
            states = other.execute(f'SELECT state FROM "{schema}".agent_action').fetchall()
        assert held == (0,), "a failed round kept the claim lock"
        assert states == [("ADMITTED",)], "the claim before the failure was committed"
        assert (await (await conn.execute("SELECT 1")).fetchone()) == (1,)


def test_a_claim_that_left_room_to_other_keys_asks_for_the_next_round_at_once(
    make_outbox, conn, schema
) -> None:
    ob = make_outbox()
    ob.declare(BUSY)
    ob.migrate()
    # Key "a" has one due head, key "b" ten: a batch of 6 gives each a share of 3, "a" takes 1.
    requests = [ActionRequest(BUSY, lane_key="a0", idempotency_key="a0", workspace_id="a")]
    requests += [
        ActionRequest(BUSY, lane_key=f"b{i}", idempotency_key=f"b{i}", workspace_id="b")
        for i in range(10)
    ]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()
    watch, cursor = ConsumptionWatch(), {}

    async def one_round() -> Round:
        async with ob.store() as store, store.connection() as c, c.transaction():
            op = bounded_claim_operation(
                schema, [BUSY.name], 64, 6, timedelta(seconds=30), watch, cursor=cursor
            )
            return await run_async(c, op)

    first = asyncio.run(one_round())
    assert sorted(c.action.workspace_id for c in first.claimed) == ["a", "b", "b", "b"]
    assert first.room_left and first.more_due
    second = asyncio.run(one_round())
    assert [c.action.workspace_id for c in second.claimed] == ["b"] * 6
    assert not second.room_left


def test_a_claim_whose_keys_had_no_more_due_asks_for_no_next_round(
    make_outbox, conn, schema
) -> None:
    # Three keys with one due head each: a batch of 6 gives each a share of 2, and each takes
    # its one. The room left is nobody's: the next round would find nothing.
    ob = make_outbox()
    ob.declare(BUSY)
    ob.migrate()
    requests = [
        ActionRequest(BUSY, lane_key=f"{k}0", idempotency_key=f"{k}0", workspace_id=k)
        for k in "abc"
    ]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()

    async def one_round() -> Round:
        async with ob.store() as store, store.connection() as c, c.transaction():
            op = bounded_claim_operation(
                schema, [BUSY.name], 64, 6, timedelta(seconds=30), ConsumptionWatch(), cursor={}
            )
            return await run_async(c, op)

    only = asyncio.run(one_round())
    assert sorted(c.action.workspace_id for c in only.claimed) == ["a", "b", "c"]
    assert not only.room_left and not only.more_due


ROUNDS = 20


async def test_a_rounds_first_look_is_planned_once_a_connection_not_every_round(
    redis_url: str,
) -> None:
    """The opening query is a simple-protocol query, which the server plans every time it runs;
    the first look (fold, pauses, counts, kinds waiting) is a function's query, so its plan is
    made once a session and kept (pg_stat_statements counts the plans)."""
    missing = missing_binaries()
    if missing:
        missing_service(missing)
    preload = {
        "shared_preload_libraries": "pg_stat_statements",
        "pg_stat_statements.track": "all",
        "pg_stat_statements.track_planning": "on",
    }
    with PrivatePostgres(max_connections=40, settings=preload) as server:
        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute("CREATE EXTENSION pg_stat_statements")
        outbox = dispatch_app.build(server.url, "planned", "PLANNED")
        outbox.migrate()
        dispatch = install(outbox, broker_from_url(redis_url))
        async with outbox.store() as store:
            claimer = Claimer(dispatch, store)
            for _ in range(ROUNDS):
                await claimer.claim()
            async with store.connection() as conn:
                backends = await (
                    await conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    )
                ).fetchone()
        with psycopg.connect(server.url, autocommit=True) as admin:
            counted = admin.execute(
                "SELECT sum(calls), sum(plans) FROM pg_stat_statements"
                " WHERE query LIKE '%agent_action_kind_pause%' AND query LIKE '%json_agg%'"
            ).fetchone()
    assert backends is not None and counted is not None
    calls, plans = counted
    assert calls >= ROUNDS, (calls, plans)
    assert plans <= backends[0], f"planned {plans} times in {calls} rounds"
