"""``cold-start``: a backlog waits while no process serves it (after a deploy, or a restart of
every process at 3 a.m.); the claimer and the worker pool are started at once, and the clock
runs from their start: when each process said it was ready, when the first claim came, and
when the backlog's actions started. Its ceiling, ``dramatiq-raw-cold-start``, is raw Dramatiq:
the same backlog of messages waiting in the queue, the same worker pool started.

The two sides take turns (``ROUNDS``, the side that goes first alternating) so that both meet
the same minutes of a shared machine; ``ratio`` is the median of the rounds' ratios of the time
to the first start. Every round starts fresh processes on a fresh backlog: the operating
system's file cache is warm for both sides (this measures the processes' start, not a disk's).

Where the outbox's cold start goes, medians over its rounds: ``worker_ready_ms`` (the pool's
every process said it was ready), ``claimer_ready_ms``, ``first_claim_ms`` (the first claim's
lease began), ``first_start_ms`` (the first adapter started), ``all_started_ms`` (the whole
backlog had started); and from the take to the adapter's start for the first action that
started (``first_take_to_start_ms``: what the warm-up of a new connection takes off the first
attempts, ``outbox.warmup``) and for the backlog's median action (``take_to_start_p50_ms``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Any

import psycopg
import redis

from benchmarks import apps
from benchmarks.common import (
    DATABASE_URL,
    REDIS_URL,
    Result,
    Scale,
    bench_schema,
    first_attempts,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.rig import PROCESSES, rig
from outbox import enqueue_many
from outbox.dispatch.processes import CLAIMER_READY, WORKER_READY, OutboxProcess

#: Rounds of each side, taking turns.
ROUNDS = {True: 3, False: 5}
#: Seconds a side's backlog may take to start, from its processes' start.
TIMEOUT = 120.0
#: How often the readiness of the processes and the starts are looked at.
POLL = 0.005


@dataclass
class ColdStart:
    """One side's round: seconds from the processes' start to each action's start, and to when
    each process said it was ready (None: not watched)."""

    starts: list[float]
    worker_ready: float | None = None
    claimer_ready: float | None = None
    first_claim: float | None = None
    first_take_to_start: float | None = None
    take_to_start_p50: float | None = None

    @property
    def first(self) -> float:
        return min(self.starts)

    @property
    def last(self) -> float:
        return max(self.starts)


class _Readiness:
    """When each watched process's log first said it was ready, in seconds from ``started``."""

    def __init__(self, started: float, watched: dict[str, tuple[OutboxProcess, str, int]]):
        self.started = started
        self.watched = watched
        self.seen: dict[str, float] = {}

    def look(self) -> None:
        for name, (proc, text, count) in self.watched.items():
            if name not in self.seen and proc.output().count(text) >= count:
                self.seen[name] = time.time() - self.started


def _wait_for_starts(
    n: int, readiness: _Readiness, started_count: Any, procs: list[OutboxProcess]
) -> None:
    deadline = time.monotonic() + TIMEOUT
    while started_count() < n or len(readiness.seen) < len(readiness.watched):
        readiness.look()
        for proc in procs:
            if proc.popen.poll() is not None:
                raise RuntimeError(f"{proc.argv} exited {proc.popen.returncode}:\n{proc.output()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"cold start: {started_count()} of {n} started in {TIMEOUT}s")
        time.sleep(POLL)


def outbox_round(schema: str, n: int, round_: int) -> ColdStart:
    """The outbox's claimer and pool started on a backlog of ``n`` one-action lanes."""
    migrated_outbox(schema)
    with psycopg.connect(DATABASE_URL) as conn:
        enqueue_many(
            conn,
            [noop_request(f"cold-{round_}-{i}", i=i) for i in range(n)],
            schema=schema,
        )
        conn.commit()
    with rig(schema, BENCH_RECORD_STARTS="1") as r:
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        started = time.time()
        workers = r.outbox_workers(wait=False)
        claimer = r.claimer(wait=False)
        readiness = _Readiness(
            started,
            {
                "worker": (workers, WORKER_READY, PROCESSES),
                "claimer": (claimer, CLAIMER_READY, 1),
            },
        )
        _wait_for_starts(n, readiness, lambda: client.hlen(apps.STARTS_KEY), [workers, claimer])
        starts = {int(k): float(v) - started for k, v in client.hgetall(apps.STARTS_KEY).items()}
    claims, takes = _attempts(schema, started)
    first = min(starts, key=starts.__getitem__)
    take_to_start = [starts[i] - takes[i] for i in starts if i in takes]
    return ColdStart(
        starts=list(starts.values()),
        worker_ready=readiness.seen["worker"],
        claimer_ready=readiness.seen["claimer"],
        first_claim=min(claims.values()),
        first_take_to_start=starts[first] - takes[first] if first in takes else None,
        take_to_start_p50=percentile(take_to_start, 50) if take_to_start else None,
    )


def _attempts(schema: str, started: float) -> tuple[dict[int, float], dict[int, float]]:
    """Each action's first claim and take, in seconds from ``started`` (one machine's clock)."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        first = first_attempts(conn, schema)
        # The next round's backlog is the only one in the table.
        conn.execute(f'DELETE FROM "{schema}".agent_action_attempt')
        conn.execute(f'DELETE FROM "{schema}".agent_action')
    return (
        {i: claimed - started for i, (claimed, _) in first.items()},
        {i: taken - started for i, (_, taken) in first.items()},
    )


def raw_round(n: int) -> ColdStart:
    """Raw Dramatiq's pool started on ``n`` messages waiting in its queue."""
    actor = apps.raw_broker_at(REDIS_URL).get_actor("bench_raw_noop")
    with rig("raw") as r:
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        for _ in range(n):
            actor.send(0.0)  # the actor records its start as "since 0": its wall-clock time
        started = time.time()
        workers = r.raw_workers(wait=False)
        readiness = _Readiness(started, {"worker": (workers, WORKER_READY, PROCESSES)})
        _wait_for_starts(n, readiness, lambda: client.llen(apps.RAW_LATENCY_KEY), [workers])
        starts = [float(v) - started for v in client.lrange(apps.RAW_LATENCY_KEY, 0, -1)]
    return ColdStart(starts=starts, worker_ready=readiness.seen["worker"])


def run(scale: Scale) -> list[Result]:
    n = scale.n(100, 500, floor=10)
    ours: list[ColdStart] = []
    raws: list[ColdStart] = []
    with bench_schema("cold_start") as schema:
        for round_ in range(ROUNDS[scale.quick]):
            ours_first = round_ % 2 == 0
            if not ours_first:
                raws.append(raw_round(n))
            ours.append(outbox_round(schema, n, round_))
            if ours_first:
                raws.append(raw_round(n))
    ratios = [o.first / r.first for o, r in zip(ours, raws, strict=True)]
    raw_row = _row("dramatiq-raw-cold-start", n, raws, 1.0, "dramatiq-raw-cold-start")
    row = _row("cold-start", n, ours, statistics.median(ratios), "dramatiq-raw-cold-start")
    row.extra["round_ratios"] = [round(x, 3) for x in ratios]
    return [raw_row, row]


def _median_ms(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return ms(statistics.median(present)) if present else None


def _row(scenario: str, n: int, rounds: list[ColdStart], ratio: float, ratio_to: str) -> Result:
    """A side's row: p50/p99 of every start of every round, from its processes' start; the
    rest medians over the rounds."""
    every = [s for one in rounds for s in one.starts]
    extra: dict[str, Any] = {
        "rounds": len(rounds),
        "latency_is": "processes started -> adapter start, a backlog waiting",
        "worker_ready_ms": _median_ms([one.worker_ready for one in rounds]),
    }
    if rounds[0].claimer_ready is not None:
        extra["claimer_ready_ms"] = _median_ms([one.claimer_ready for one in rounds])
        extra["first_claim_ms"] = _median_ms([one.first_claim for one in rounds])
    extra["first_start_ms"] = _median_ms([one.first for one in rounds])
    extra["all_started_ms"] = _median_ms([one.last for one in rounds])
    if rounds[0].claimer_ready is not None:
        extra["first_take_to_start_ms"] = _median_ms([one.first_take_to_start for one in rounds])
        extra["take_to_start_p50_ms"] = _median_ms([one.take_to_start_p50 for one in rounds])
    last = statistics.median(one.last for one in rounds)
    return Result(
        scenario=scenario,
        n=n,
        actions_per_s=round(n / last, 1),
        p50_ms=ms(percentile(every, 50)),
        p99_ms=ms(percentile(every, 99)),
        ratio=round(ratio, 3),
        ratio_to=ratio_to,
        extra=extra,
    )
