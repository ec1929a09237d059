"""``inprocess``: N no-op actions run by the in-process executor (``Outbox.run_until_idle``:
``claim_and_run`` rounds, ``CONCURRENCY`` of them overlapping, as ``outbox.testing.drain`` runs
them with its ``concurrency``), no broker. Each attempt passes its fence (``begin_write``) and
ends DONE with its epoch-fenced finish, exactly as a real adapter's would.

The actions are enqueued before the clock starts; the clock runs from the first claim until
every action ended. ``ratio`` is actions/s over pgbench's transactions/s (one INSERT and one
UPDATE a transaction) with as many clients as the executor's pool has connections, measured in
the same run. Its peer, ``pgqueuer-inprocess``, drains with 5 concurrent consumers of a batch of
100: the same as ``CONCURRENCY`` rounds of ``batch_size`` (100).
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from benchmarks import pgbench, server_time
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
from benchmarks.cpu import CpuMeter
from outbox import Abandoned, ActionAttempt, Done, Outbox, event_loop
from outbox import Result as ActionResult
from outbox.connecting import CONNECTION_OPTIONS
from outbox.executor import Outcome
from outbox.rounds import run_until_idle
from outbox.store import ClaimedAction


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


#: Rounds that overlap (``Outbox.run_until_idle``'s ``concurrency``): as many as the peer's
#: consumers, within the pool's 10 connections.
CONCURRENCY = 5


async def run_all(
    outbox: Outbox, n: int, session: dict[str, Any] | None = None
) -> tuple[float, int, list[float], dict[str, float | None]]:
    """Seconds to run every due action, the rounds it took, each round's duration, and the
    attempts a statement of each group-committed sort carried on average, with the CPU ms an
    action of this process and of PostgreSQL (read while the pool's backends are alive).
    ``session``: connection arguments of the pool's sessions (``server_time.session_options``)."""
    rounds: list[float] = []
    # Every connection of the pool open before the clock starts, as the peer's consumers connect
    # before its clock: a pool that grows while rounds wait for connections times its growth.
    pool = AsyncConnectionPool(
        outbox.settings.require_database_url(),
        min_size=outbox.settings.pool_size,
        max_size=outbox.settings.pool_size,
        kwargs={"autocommit": True, **CONNECTION_OPTIONS, **(session or {})},
        open=False,
    )
    await pool.open(wait=True)
    async with pool, outbox.store(pool) as store:
        executor = outbox.executor(store)

        async def claim() -> tuple[float, tuple[float, list[ClaimedAction]]]:
            return time.perf_counter(), await outbox._claim(executor, None, None)

        async def run(claimed: tuple[float, tuple[float, list[ClaimedAction]]]) -> list[Outcome]:
            outcomes = await outbox._run_claimed(executor, claimed[1])
            rounds.append(time.perf_counter() - claimed[0])
            return outcomes

        outcomes: list[Outcome] = []
        cpu = CpuMeter(client=os.getpid())
        cpu.start()
        started = time.perf_counter()
        await run_until_idle(
            claim,
            run,
            outcomes.extend,
            CONCURRENCY,
            claimed=lambda c: bool(c[1][1]),
            claims_overlap=outbox._claims_may_overlap(None),
        )
        took = time.perf_counter() - started
        cpu.stop()
        done = sum(1 for o in outcomes if o.recorded)
        if done != n:
            raise RuntimeError(f"{done} of {n} actions ended")
        per_statement: dict[str, float | None] = {
            f"{w.name}_per_statement": round(w.calls / w.statements, 1)
            for w in store.group_writers
            if w.statements
        }
        return took, len(rounds), rounds, {**per_statement, **cpu.per_action_ms(n)}


def drain(n: int) -> Result:
    """One drain of ``n`` actions in a schema of its own: the ``inprocess`` row without its
    ceiling (``with_ceiling`` adds it)."""
    with bench_schema("inprocess") as schema:
        adapter = NoopAdapter()
        outbox = migrated_outbox(schema)
        outbox.register(NOOP, adapter)
        bulk_enqueue(schema, n)
        with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
            conn.execute(f'VACUUM ANALYZE "{schema}".agent_action')
        # Where the server's time goes (the lane bookkeeping's triggers and fold, the guard),
        # counted in the pool's sessions only: the enqueue above is not part of the drain.
        tracked = server_time.tracking(schema)
        seconds, rounds, round_s, per_statement = event_loop.run(
            run_all(outbox, n, server_time.session_options(schema, tracked)),
            outbox.settings.event_loop,
        )
        functions = server_time.per_action(schema, n, tracked)
    return Result(
        scenario="inprocess",
        n=n,
        actions_per_s=round(n / seconds, 1),
        p50_ms=ms(percentile(round_s, 50)),
        p99_ms=ms(percentile(round_s, 99)),
        extra={
            "batch_size": outbox.settings.batch_size,
            "pool_size": outbox.settings.pool_size,
            "rounds": rounds,
            "concurrency": CONCURRENCY,
            "latency_is": "one claim_and_run round (claim, fences, finishes)",
            "fence_p50_ms": ms(percentile(adapter.seconds, 50)),
            "fence_p99_ms": ms(percentile(adapter.seconds, 99)),
            **per_statement,
            "server_functions": functions,
        },
    )


def ceiling(scale: Scale, row: Result) -> pgbench.Ceiling:
    """pgbench's INSERT-and-UPDATE transactions a second with as many clients as ``row``'s
    drain had connections in its pool, in a schema of its own."""
    with bench_schema("inprocess_ceiling") as schema:
        return pgbench.measure(schema, row.extra["pool_size"], scale.seconds(quick=5, full=15))


def with_ceiling(row: Result, measured: pgbench.Ceiling) -> Result:
    """``row`` with its ratio to the ceiling measured in the same run."""
    rate = row.actions_per_s or 0.0
    return replace(
        row,
        ratio=round(rate / measured.tps, 3),
        ratio_to=measured.name,
        extra={"ceiling_per_s": round(measured.tps, 1), **row.extra},
    )


def n_actions(scale: Scale) -> int:
    """The N of a drain (its peer's, ``pgqueuer-inprocess``, too)."""
    return scale.n(5_000, 50_000, floor=50)


def run(scale: Scale) -> list[Result]:
    row = drain(n_actions(scale))
    return [with_ceiling(row, ceiling(scale, row))]
