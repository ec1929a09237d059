"""What a dispatch claim round sends and waits for: no claim statement for a kind with nothing
to claim, so a claimer serving many kinds pays for the ones with work, not for every kind it
serves; and no wait for a housekeeping turn, which runs beside the rounds."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from datetime import timedelta
from typing import Any

import psycopg

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import Statement, run_async
from outbox.dispatch import Claimer, broker_from_url, install
from outbox.dispatch.claimer import Round, bounded_claim_operation
from outbox.dispatch.consumption import ConsumptionWatch
from outbox.maintenance.runner import Maintenance
from outbox.maintenance.service import MaintenanceService
from outbox.queries import queries_for
from tests.apps import dispatch_app

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
