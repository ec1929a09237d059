"""``backlog-small``, ``backlog-large``: the drain after an outage. N one-action lanes wait while
nothing serves them (a fabric or database outage, a deploy that stopped every process, a kind
paused for hours), enqueued 1,000 a statement as an application's batch job would; then a real
``outbox claimer`` and a real ``outbox worker`` pool are started on them, and the drain is timed.

The question is whether a large backlog slows the drain: an index, a fold of the lane intake, a
sort or a gauge whose cost grows with what waits would make each claim dearer while the backlog
is large, exactly when the outbox must catch up. ``ratio`` is the large backlog's steady rate
over the small one's, the two taken in turns (small, large, small: the large one's rate over the
mean of the two small ones'); at 1.0 the rate does not depend on how much waits.

``backlog-scheduled``: the small backlog again, but scheduled: enqueued with one ``not_before``
for all (a newsletter or reminders set for 9:00) while the claimer and the pool already run,
idle; its drain is timed from that time. ``ratio`` is its steady rate over the small backlog's:
at 1.0 a burst of scheduled actions coming due at once drains as a backlog does (the claims'
fold moves the lanes into the claims' index as they come due, 5,000 a claim).

The steady rate leaves out the processes' start and the last stragglers: the actions that ended
between the 5th and the 95th percentile of the end times, over that span (database clock).
p50/p99 are the end times from the processes' start, over the whole backlog (the first drain
of its size). The CPU ms an action of each process and service, which say whether the cost an
action grows with the backlog, include the processes' start (a larger share of a small
backlog's).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

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
#: Seconds from the scheduled backlog's enqueue to its ``not_before`` (its enqueue takes about
#: one for 20,000 actions).
SCHEDULED_LEAD = 8.0
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


def _enqueue(schema: str, n: int, not_before: datetime | None = None) -> None:
    with psycopg.connect(DATABASE_URL) as conn:
        for start in range(0, n, PER_STATEMENT):
            batch = range(start, min(n, start + PER_STATEMENT))
            requests = [
                replace(noop_request(f"backlog-{i}", i=i), not_before=not_before) for i in batch
            ]
            enqueue_many(conn, requests, schema=schema)
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
            return _drained(n, schema, watch, started_at, cpu)


def drain_scheduled(n: int, lead: float) -> Drain:
    """``n`` one-action lanes enqueued with one ``not_before``, ``lead`` seconds ahead, while a
    claimer and a pool run idle; timed from that ``not_before``."""
    with bench_schema("backlog_scheduled") as schema:
        migrated_outbox(schema)
        with rig(schema) as r, psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            pids = r.idle_outbox()
            due = watch.execute("SELECT now() + %s * interval '1 second'", (lead,)).fetchone()
            assert due is not None
            _enqueue(schema, n, due[0])
            cpu = CpuMeter(services_for(REDIS_URL), **pids)
            cpu.start()
            return _drained(n, schema, watch, due[0], cpu)


def _drained(
    n: int, schema: str, watch: psycopg.Connection[Any], started_at: datetime, cpu: CpuMeter
) -> Drain:
    """Waits for every action of ``schema`` to end; the drain from ``started_at``."""
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


def _row(
    scenario: str,
    drains: list[Drain],
    ratio: float,
    ratio_to: str,
    latency_is: str = "each end, from the claimer's and the pool's start",
) -> Result:
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
            "latency_is": latency_is,
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
    scheduled = drain_scheduled(small_n, SCHEDULED_LEAD)
    small_per_s = statistics.mean([before.steady_per_s, after.steady_per_s])
    return [
        _row("backlog-small", [before, after], 1.0, "backlog-small"),
        _row("backlog-large", [large], large.steady_per_s / small_per_s, "backlog-small"),
        _row(
            "backlog-scheduled",
            [scheduled],
            scheduled.steady_per_s / small_per_s,
            "backlog-small",
            "each end, from the actions' not_before",
        ),
    ]
