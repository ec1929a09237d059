"""``backlog-small``, ``backlog-large``: the drain after an outage. N one-action lanes wait while
nothing serves them (a fabric or database outage, a deploy that stopped every process, a kind
paused for hours), enqueued 1,000 a statement as an application's batch job would; then a real
``outbox claimer`` and a real ``outbox worker`` pool are started on them, and the drain is timed.

The question is whether a large backlog slows the drain: an index, a fold of the lane intake, a
sort or a gauge whose cost grows with what waits would make each claim dearer while the backlog
is large, exactly when the outbox must catch up. ``ratio`` is the large backlog's steady rate
over the small one's, the two taken in turns (small, large, small: the large one's rate over the
mean of the two small ones'); at 1.0 the rate does not depend on how much waits.

The steady rate leaves out the processes' start and the last stragglers: the actions that ended
between the 5th and the 95th percentile of the end times, over that span (database clock).
p50/p99 are the end times from the processes' start, over the whole backlog (the first drain
of its size). The CPU ms an action of each process and service, which say whether the cost an
action grows with the backlog, include the processes' start (a larger share of a small
backlog's).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import psycopg

from benchmarks.common import (
    DATABASE_URL,
    REDIS_URL,
    Result,
    Scale,
    all_ended,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
)
from benchmarks.cpu import CpuMeter
from benchmarks.rig import rig, services_for, wait_until
from outbox import enqueue_many

#: Actions an enqueue statement (and transaction) carries.
PER_STATEMENT = 1_000
#: Seconds a backlog may take to drain.
TIMEOUT = 1_200.0
#: The share of the end times left out at each end of the drain (start-up, stragglers).
TRIM = 0.05


@dataclass(frozen=True)
class Drain:
    """One backlog's drain: its steady rate, its end times from the processes' start, and the
    CPU ms an action of each process and service."""

    n: int
    steady_per_s: float
    ends: list[float]
    cpu_ms: dict[str, float | None]


def _enqueue(schema: str, n: int) -> None:
    with psycopg.connect(DATABASE_URL) as conn:
        for start in range(0, n, PER_STATEMENT):
            batch = range(start, min(n, start + PER_STATEMENT))
            enqueue_many(conn, [noop_request(f"backlog-{i}", i=i) for i in batch], schema=schema)
            conn.commit()
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f'VACUUM ANALYZE "{schema}".agent_action')


def drain(n: int) -> Drain:
    """``n`` waiting one-action lanes in a schema of their own, then a claimer and a pool."""
    with bench_schema("backlog") as schema:
        migrated_outbox(schema)
        _enqueue(schema, n)
        with rig(schema) as r, psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            started_at = watch.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            workers = r.outbox_workers(wait=False)
            claimer = r.claimer(wait=False)
            cpu = CpuMeter(services_for(REDIS_URL), claimer=claimer.pid, workers=workers.pid)
            cpu.start()
            wait_until(lambda: all_ended(watch, schema), TIMEOUT, "backlog not drained", 0.05)
            cpu.stop()
            rows = watch.execute(
                f"SELECT extract(epoch FROM ended_at - %s)::float8, state"
                f' FROM "{schema}".agent_action ORDER BY ended_at',
                (started_at,),
            ).fetchall()
    states = {state for _, state in rows}
    if states != {"DONE"}:
        raise AssertionError(f"backlog: not every action ended DONE: {states}")
    ends = [end for end, _ in rows]
    first, last = int(n * TRIM), int(n * (1 - TRIM)) - 1
    span = ends[last] - ends[first]
    # A tiny backlog (the smoke test's) ends in one or two finish statements, which stamp their
    # actions alike: then the whole drain is the span.
    steady = (last - first) / span if span > 0 else n / ends[-1]
    return Drain(n=n, steady_per_s=steady, ends=ends, cpu_ms=cpu.per_action_ms(n))


def _row(scenario: str, drains: list[Drain], ratio: float, ratio_to: str) -> Result:
    one = drains[0]
    return Result(
        scenario=scenario,
        n=one.n,
        actions_per_s=round(statistics.mean(d.steady_per_s for d in drains), 1),
        p50_ms=ms(statistics.median(one.ends)),
        p99_ms=ms(one.ends[int(len(one.ends) * 0.99) - 1]),
        ratio=round(ratio, 3),
        ratio_to=ratio_to,
        extra={
            "latency_is": "each end, from the claimer's and the pool's start",
            "steady_is": f"ends between the {TRIM:.0%} and {1 - TRIM:.0%} percentiles",
            "drains_per_s": [round(d.steady_per_s, 1) for d in drains],
            "drain_s": round(one.ends[-1], 2),
            **one.cpu_ms,
        },
    )


def run(scale: Scale) -> list[Result]:
    small_n = scale.n(2_000, 20_000, floor=100)
    large_n = scale.n(20_000, 200_000, floor=1_000)
    before = drain(small_n)
    large = drain(large_n)
    after = drain(small_n)
    small_per_s = statistics.mean([before.steady_per_s, after.steady_per_s])
    return [
        _row("backlog-small", [before, after], 1.0, "backlog-small"),
        _row("backlog-large", [large], large.steady_per_s / small_per_s, "backlog-small"),
    ]
