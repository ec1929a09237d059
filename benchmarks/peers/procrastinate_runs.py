"""procrastinate, the peer of the latency and the lanes scenarios: ``WORKERS`` worker processes
of ``CONCURRENCY`` sub-workers each (the outbox pool's layout), LISTEN/NOTIFY on (its default).

- ``procrastinate-latency``: jobs deferred one a transaction (``defer_async``) at 100/s while
  the workers idle; the time from ``defer_async`` returning to the task's start, as ``latency``
  measures the outbox's.
- ``procrastinate-idle``: those worker processes with nothing to do, watched as ``idle`` watches
  the outbox's processes.
- ``procrastinate-lanes-50``, ``procrastinate-lanes-1000``: the ``lanes`` scenario's jobs with
  ``lock=`` the lane (procrastinate runs the jobs of one lock one at a time, oldest first),
  deferred in batches of 100 (``batch_defer_jobs_async``, one statement a batch) by concurrent
  enqueuers while the workers run; throughput from the first defer until every job succeeded.
  Afterwards every job must have succeeded, each lock's jobs in id order (events ``started``
  and ``succeeded``), as the outbox's lanes are checked. Its jobs table is ANALYZEd once the
  enqueuers are done, as ``lanes`` does the outbox's (see ``lanes.analyze``).
"""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

import psycopg
import redis

from benchmarks import dramatiq_raw, idle, lanes
from benchmarks.common import DATABASE_URL, REDIS_URL, Result, Scale, bench_schema, ms, percentile
from benchmarks.peers import procrastinate_app
from benchmarks.peers.pgqueuer_runs import latency_result
from benchmarks.peers.procrastinate_app import (
    CONCURRENCY,
    READY,
    STARTS_KEY,
    TASK,
    WORKERS,
    make_app,
)
from benchmarks.rig import IDLE_SETTLE, REPO, Rig, paced, rig, wait_until
from outbox.dispatch.processes import OutboxProcess


async def install(schema: str) -> None:
    """Creates ``schema`` and procrastinate's tables in it, its events stamped by the clock of
    the statement that makes them."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    app = make_app(schema, pool_size=1)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        # procrastinate stamps an event with now(), its transaction's start: a fetch that began
        # before its lock's previous job finished (and chose only after that finish committed)
        # would read as starting before that job ended. The statement's own clock orders them:
        # a job's "started" is stamped after its fetch saw the previous one's "succeeded"
        # committed. One function call an event, the same work as now().
        conn.execute(
            f'ALTER TABLE "{schema}".procrastinate_events'
            " ALTER COLUMN at SET DEFAULT clock_timestamp()"
        )


def _start_workers(r: Rig, schema: str) -> list[int]:
    """``WORKERS`` worker processes, each ready and listening: their pids."""
    argv = [sys.executable, "-m", procrastinate_app.__name__, schema]
    pids = []
    for _ in range(WORKERS):
        proc = OutboxProcess(argv, r.env(), cwd=REPO)
        r.stack.callback(proc.close)
        proc.wait_for(READY, timeout=60)
        pids.append(proc.pid)
    time.sleep(IDLE_SETTLE * 2)  # each registers and LISTENs a moment after it opened
    return pids


def _settings() -> dict[str, Any]:
    return {"workers": WORKERS, "concurrency": CONCURRENCY}


async def _defer_paced(schema: str, n: int) -> dict[int, float]:
    app = make_app(schema, pool_size=1)
    committed: dict[int, float] = {}
    async with app.open_async():
        noop = app.tasks[TASK]
        for _ in paced(n, dramatiq_raw.PACE):
            job_id = await noop.defer_async(record=True)
            committed[job_id] = time.time()
    return committed


def run_latency(scale: Scale) -> list[Result]:
    n = scale.n(300, 3_000, floor=20)  # as ``latency``
    with bench_schema("procrastinate_latency") as schema, rig(schema) as r:
        asyncio.run(install(schema))
        _start_workers(r, schema)
        committed = asyncio.run(_defer_paced(schema, n))
        with redis.Redis.from_url(REDIS_URL) as client:
            wait_until(lambda: client.hlen(STARTS_KEY) >= n, 60, "procrastinate jobs not started")
            starts = {int(k): float(v) for k, v in client.hgetall(STARTS_KEY).items()}
    return [latency_result("procrastinate-latency", committed, starts, _settings())]


def run_idle(scale: Scale) -> list[Result]:
    with bench_schema("procrastinate_idle") as schema, rig(schema) as r:
        asyncio.run(install(schema))
        pids = _start_workers(r, schema)
        workers = {f"worker{i}": pid for i, pid in enumerate(pids)}
        row = idle.watched("procrastinate-idle", idle.Watch.of(scale), _settings(), **workers)
    # One figure for the processes, as the outbox's rows give one a process kind.
    shares = [row.extra.pop(f"{name}_cpu_pct") for name in workers]
    row.extra["workers_cpu_pct"] = (
        None if None in shares else round(sum(s for s in shares if s is not None), 3)
    )
    return [row]


async def _defer_lanes(schema: str, n: int, lane_count: int) -> int:
    """Every job of ``lanes.plan``, each enqueuer's batches one after the other, the enqueuers
    at the same time; the errors the defers raised (each failed batch is tried again)."""
    app = make_app(schema, pool_size=lanes.ENQUEUERS)
    errors = 0
    async with app.open_async():
        noop = app.tasks[TASK]

        async def enqueuer(batches: list[list[int]]) -> None:
            nonlocal errors
            for batch in batches:
                jobs = [
                    noop.configure(lock=f"lane-{i % lane_count}").job.evolve(task_kwargs={"i": i})
                    for i in batch
                ]
                for _ in range(lanes.TRIES):
                    try:
                        await app.job_manager.batch_defer_jobs_async(jobs)
                        break
                    except Exception:
                        errors += 1
                else:
                    raise RuntimeError(f"procrastinate: a batch failed {lanes.TRIES} times")

        await asyncio.gather(*(enqueuer(b) for b in lanes.plan(n, lane_count)))
    return errors


def _ended(watch: psycopg.Connection[Any], schema: str) -> int:
    row = watch.execute(
        f"""SELECT count(*) FROM "{schema}".procrastinate_jobs
             WHERE status NOT IN ('todo', 'doing')"""
    ).fetchone()
    return row[0] if row else 0


def records(watch: psycopg.Connection[Any], schema: str) -> list[lanes.Record]:
    """Every job as a ``lanes.Record``: its lock, and its events' times (deferred, started,
    succeeded)."""
    rows = watch.execute(
        f"""SELECT j.lock, j.id, j.status::text,
                   count(*) FILTER (WHERE e.type = 'started'),
                   extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'deferred'))::float8,
                   extract(epoch FROM min(e.at) FILTER (WHERE e.type = 'started'))::float8,
                   extract(epoch FROM max(e.at) FILTER (WHERE e.type = 'succeeded'))::float8
              FROM "{schema}".procrastinate_jobs j
              JOIN "{schema}".procrastinate_events e ON e.job_id = j.id
             GROUP BY j.id"""
    ).fetchall()
    return [
        lanes.Record(lane, id_, "DONE" if status == "succeeded" else status, *times)
        for lane, id_, status, *times in rows
    ]


def _lanes_once(name: str, n: int, lane_count: int) -> Result:
    with bench_schema(f"procrastinate_{name}") as schema, rig(schema) as r:
        asyncio.run(install(schema))
        _start_workers(r, schema)
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            started = time.perf_counter()
            errors = asyncio.run(_defer_lanes(schema, n, lane_count))
            enqueued = time.perf_counter()
            lanes.analyze(watch, schema, "procrastinate_jobs")
            done_at = wait_until(
                lambda: _ended(watch, schema) >= n, 900, "procrastinate jobs not ended", 0.02
            )
            jobs = records(watch, schema)
    lanes.check(jobs, n, f"procrastinate-{name}")
    in_system = [r.end - r.created for r in jobs]
    return Result(
        scenario=f"procrastinate-{name}",
        n=n,
        actions_per_s=round(n / (done_at - started), 1),
        p50_ms=ms(percentile(in_system, 50)),
        p99_ms=ms(percentile(in_system, 99)),
        ratio=1.0,
        ratio_to=f"procrastinate-{name}",
        extra={
            "lanes": lane_count,
            "enqueue_errors": errors,
            "enqueue_s": round(enqueued - started, 2),
            "latency_is": "defer -> succeeded, database clock, under load",
            **_settings(),
        },
    )


def run_lanes(scale: Scale) -> list[Result]:
    return [_lanes_once(name, n, lane_count) for name, n, lane_count in lanes.shapes(scale)]
