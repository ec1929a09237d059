"""``inprocess``: N no-op actions run by the in-process executor (``Outbox.claim_and_run``, the
loop ``outbox.testing.drain_async`` runs), no broker. Each attempt passes its fence
(``begin_write``) and ends DONE with its epoch-fenced finish, exactly as a real adapter's would.

The actions are enqueued before the clock starts; the clock runs from the first claim until
every action ended. ``ratio`` is actions/s over pgbench's transactions/s (one INSERT and one
UPDATE a transaction) with as many clients as the executor's pool has connections, measured in
the same run.
"""

from __future__ import annotations

import asyncio
import time

import psycopg

from benchmarks import pgbench
from benchmarks.common import (
    DATABASE_URL,
    NOOP,
    Result,
    Scale,
    bench_schema,
    bulk_enqueue,
    migrated_outbox,
    ms,
    percentile,
)
from outbox import Abandoned, ActionAttempt, Done, Outbox
from outbox import Result as ActionResult


class NoopAdapter:
    """Passes the fence and reports the effect done; times each attempt from start to return."""

    def __init__(self) -> None:
        self.seconds: list[float] = []

    async def execute(self, attempt: ActionAttempt) -> ActionResult:
        started = time.perf_counter()
        if not await attempt.fence().begin_write():
            return Abandoned()
        self.seconds.append(time.perf_counter() - started)
        return Done(ref="noop")


async def run_all(outbox: Outbox, n: int) -> tuple[float, int, list[float], dict[str, float]]:
    """Seconds to run every due action, the rounds it took, each round's duration, and the
    attempts a statement of each group-committed sort carried on average."""
    rounds: list[float] = []
    done = 0
    async with outbox.store() as store:
        executor = outbox.executor(store)
        started = time.perf_counter()
        while done < n:
            round_started = time.perf_counter()
            outcomes = await outbox.claim_and_run(executor)
            if not outcomes:
                raise RuntimeError(f"nothing due after {done} of {n} actions")
            done += sum(1 for o in outcomes if o.recorded)
            rounds.append(time.perf_counter() - round_started)
        took = time.perf_counter() - started
        per_statement = {
            f"{w.name}_per_statement": round(w.calls / w.statements, 1)
            for w in store.group_writers
            if w.statements
        }
        return took, len(rounds), rounds, per_statement


def run(scale: Scale) -> list[Result]:
    n = scale.n(5_000, 50_000, floor=50)
    with bench_schema("inprocess") as schema:
        adapter = NoopAdapter()
        outbox = migrated_outbox(schema)
        outbox.register(NOOP, adapter)
        bulk_enqueue(schema, n)
        with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
            conn.execute(f'VACUUM ANALYZE "{schema}".agent_action')
        seconds, rounds, round_s, per_statement = asyncio.run(run_all(outbox, n))
        ceiling = pgbench.measure(
            schema, outbox.settings.pool_size, scale.seconds(quick=5, full=15)
        )
    rate = n / seconds
    return [
        Result(
            scenario="inprocess",
            n=n,
            actions_per_s=round(rate, 1),
            p50_ms=ms(percentile(round_s, 50)),
            p99_ms=ms(percentile(round_s, 99)),
            ratio=round(rate / ceiling.tps, 3),
            ratio_to=ceiling.name,
            extra={
                "ceiling_per_s": round(ceiling.tps, 1),
                "batch_size": outbox.settings.batch_size,
                "pool_size": outbox.settings.pool_size,
                "rounds": rounds,
                "latency_is": "one claim_and_run round (claim, fences, finishes)",
                "fence_p50_ms": ms(percentile(adapter.seconds, 50)),
                "fence_p99_ms": ms(percentile(adapter.seconds, 99)),
                **per_statement,
            },
        )
    ]
