"""What a dispatch claim round sends: no claim statement for a kind with nothing to claim, so
a claimer serving many kinds pays for the ones with work, not for every kind it serves."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from datetime import timedelta
from typing import Any

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import Statement, run_async
from outbox.dispatch.claimer import Round, bounded_claim_operation
from outbox.dispatch.consumption import ConsumptionWatch
from outbox.queries import queries_for

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
    # One look, then the busy kind's heads; no reclaim (no lease ran out) and nothing at all
    # for the five idle kinds (before: a reclaim and a key walk each).
    assert sent == ["claim_round_state", "claim_limit_keys", "claim_heads"], sent

    idle, sent = _round(ob, schema, kinds, timedelta(seconds=1))
    assert idle.claimed == [] and sent == ["claim_round_state"], sent

    time.sleep(1.2)  # the three leases run out unconsumed: the next round reclaims them
    probe, sent = _round(ob, schema, kinds, timedelta(seconds=30))
    assert len(probe.claimed) == 1  # a probe: no worker took the last claims
    assert sent == ["claim_round_state", "claim_reclaims"], sent
