"""``e2e``: N no-op actions enqueued 100 a transaction, claimed by a real ``outbox claimer``,
pushed through Dramatiq on Redis, run by a real ``outbox worker`` pool with the fence, and
finished, every guarantee on. The clock runs from the first enqueue until the last action is
DONE in PostgreSQL; p50/p99 are each action's time from its enqueue transaction's start to its
finish (database clock), under that load.

Throughput on a shared 2-core machine drifts by a third from one minute to the next, so the
ratio is taken in rounds: each round measures ``dramatiq-raw`` (the ceiling) and then ``e2e``
back to back, and ``ratio`` is the median of the rounds' ratios.

- ``e2e``: the application enqueues with ``enqueue_many`` (one statement a transaction);
- ``e2e-single``: one ``enqueue`` call an action (100 a transaction), fewer rounds;
- ``e2e-celery``: as ``e2e``, through the Celery fabric (``OUTBOX_FABRIC=celery``, Celery
  workers of the same layout), against ``celery-raw``.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import psycopg

from benchmarks import dramatiq_raw
from benchmarks.common import (
    DATABASE_URL,
    NOOP,
    REDIS_URL,
    Result,
    Scale,
    all_ended,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.cpu import CpuMeter
from benchmarks.rig import broker_settings, rig, services_for, wait_until
from outbox import Outbox

#: Actions per enqueueing transaction (an application's batch job, say).
PER_TX = 100
#: Paired rounds of a quick and of a default run, of e2e and of e2e-single.
ROUNDS = (3, 9)
SINGLE_ROUNDS = (1, 3)


@dataclass(frozen=True)
class Run:
    """One e2e run and the ceiling measured just before it."""

    n: int
    per_s: float
    ceiling_per_s: float
    in_system: list[float]
    enqueue_s: float
    max_attempt: int
    states: dict[str, int]
    cpu_ms: dict[str, float | None]

    @property
    def ratio(self) -> float:
        return self.per_s / self.ceiling_per_s


def _enqueue(outbox: Outbox, n: int, many: bool, body: Callable[[int], str] | None) -> None:
    with psycopg.connect(DATABASE_URL) as conn:
        for start in range(0, n, PER_TX):
            batch = range(start, min(n, start + PER_TX))
            requests = [
                noop_request(f"e2e-{i}", f"lane-{i}", i, None if body is None else body(i))
                for i in batch
            ]
            if many:
                outbox.enqueue_many(conn, requests)
            else:
                for request in requests:
                    outbox.enqueue(conn, request)
            conn.commit()


def run_once(
    n: int,
    ceiling_per_s: float,
    *,
    many: bool,
    fabric: str = "dramatiq",
    broker_url: str = REDIS_URL,
    body: Callable[[int], str] | None = None,
) -> Run:
    """Enqueues ``n`` actions into a fresh schema while a claimer and a worker pool run them
    (Dramatiq's on ``broker_url``, or Celery's); ``body``: the text the ``i``-th action's
    payload carries besides its number (none by default)."""
    settings = {"OUTBOX_FABRIC": fabric, **broker_settings(broker_url)}
    with bench_schema("e2e") as schema, rig(schema, **settings) as r:
        outbox = migrated_outbox(schema)
        if fabric == "celery":
            pids = r.outbox_celery_workers(NOOP.queue_name)
            workers = {f"workers{i}": pid for i, pid in enumerate(pids)}
        else:
            workers = {"workers": r.outbox_workers().pid}
        services = services_for(broker_url)
        cpu = CpuMeter(services, claimer=r.claimer().pid, enqueuer=os.getpid(), **workers)
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            table = f'"{schema}".agent_action'

            cpu.start()
            started = time.perf_counter()
            _enqueue(outbox, n, many, body)
            enqueued = time.perf_counter()
            done_at = wait_until(
                lambda: all_ended(watch, schema), 600, "e2e actions not ended", 0.02
            )
            cpu.stop()
            states = dict(
                watch.execute(f"SELECT state, count(*) FROM {table} GROUP BY state").fetchall()
            )
            (max_attempt,) = watch.execute(f"SELECT max(attempt) FROM {table}").fetchone()
            # Time in the system by the database clock: enqueue transaction start -> finish.
            in_system = [
                row[0]
                for row in watch.execute(
                    f"SELECT extract(epoch FROM ended_at - created_at)::float8 FROM {table}"
                )
            ]
    if states != {"DONE": n}:
        raise AssertionError(f"e2e: not every action ended DONE: {states}")
    return Run(
        n=n,
        per_s=n / (done_at - started),
        ceiling_per_s=ceiling_per_s,
        in_system=in_system,
        enqueue_s=enqueued - started,
        max_attempt=max_attempt,
        states=states,
        cpu_ms=cpu.per_action_ms(n),
    )


def result(scenario: str, runs: list[Run], enqueue: str, ratio_to: str = "dramatiq-raw") -> Result:
    ratios = [run.ratio for run in runs]
    median = sorted(runs, key=lambda run: run.ratio)[len(runs) // 2]
    return Result(
        scenario=scenario,
        n=median.n,
        actions_per_s=round(median.per_s, 1),
        p50_ms=ms(percentile(median.in_system, 50)),
        p99_ms=ms(percentile(median.in_system, 99)),
        ratio=round(statistics.median(ratios), 3),
        ratio_to=ratio_to,
        extra={
            "enqueue": enqueue,
            "rounds": len(runs),
            "round_ratios": [round(r, 3) for r in ratios],
            "ceiling_per_s": round(median.ceiling_per_s, 1),
            "round_ceilings_per_s": [round(run.ceiling_per_s, 1) for run in runs],
            "latency_is": "enqueue transaction start -> DONE, database clock, under load",
            "enqueue_s": round(median.enqueue_s, 2),
            "max_attempt": median.max_attempt,
            "states": median.states,
            **median.cpu_ms,
        },
    )


def run(scale: Scale) -> list[Result]:
    raw = dramatiq_raw.measure(scale)
    n = dramatiq_raw.raw_n(scale)
    runs: list[Run] = []
    for index in range(scale.n(*ROUNDS)):
        ceiling = raw.per_s if index == 0 else dramatiq_raw.throughput(n).per_s
        runs.append(run_once(n, ceiling, many=True))
    singles = [
        run_once(n, dramatiq_raw.throughput(n).per_s, many=False)
        for _ in range(scale.n(*SINGLE_ROUNDS))
    ]
    return [
        result("e2e", runs, f"enqueue_many, {PER_TX} a transaction"),
        result("e2e-single", singles, f"enqueue one by one, {PER_TX} a transaction"),
    ]


def run_celery(scale: Scale) -> list[Result]:
    """``e2e-celery``: rounds of ``celery-raw`` then ``e2e`` through the Celery fabric."""
    from benchmarks import celery_raw

    raw = celery_raw.measure(scale)
    n = dramatiq_raw.raw_n(scale)
    runs: list[Run] = []
    for index in range(scale.n(*ROUNDS)):
        ceiling = raw.per_s if index == 0 else celery_raw.throughput(n).per_s
        runs.append(run_once(n, ceiling, many=True, fabric="celery"))
    return [result("e2e-celery", runs, f"enqueue_many, {PER_TX} a transaction", "celery-raw")]
