"""pgqueuer, the peer of the in-process executor and of the latency scenario.

- ``pgqueuer-inprocess``: the drain strategy of pgqueuer's own benchmark tool
  (``tools/benchmark.py --strategy drain``): N no-op jobs enqueued in one call before the clock
  starts, then consumers drain the queue. Its defaults (5 consumers, each a ``PgQueuer`` on a
  connection of its own, in one uvloop process), with the psycopg driver and a dequeue batch of
  100. The same N as ``inprocess``.
- ``pgqueuer-latency``: jobs enqueued one a transaction (pgqueuer's ``enqueue`` on an autocommit
  connection) at 100/s while one consumer process idles (pgqueuer's defaults: LISTEN/NOTIFY,
  batch size 10); the time from ``enqueue`` returning to the entrypoint's start, as ``latency``
  measures the outbox's.
- ``pgqueuer-idle``: that consumer process with nothing to do, watched as ``idle`` watches the
  outbox's processes.
- ``pgqueuer-horizon``: ``horizon``'s batches, each enqueued in one call and drained as
  ``pgqueuer-inprocess`` drains its jobs, with nothing held and then while another session
  holds a snapshot open; the held side's late rate (``horizon.late_rate``), and it over the
  free side's.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Callable

import redis
import uvloop
from pgqueuer.models import Job
from pgqueuer.types import QueueExecutionMode

from benchmarks import dramatiq_raw, horizon, idle, inprocess
from benchmarks.common import REDIS_URL, Result, Scale, bench_schema, ms, percentile
from benchmarks.cpu import CpuMeter
from benchmarks.peers import pgqueuer_app
from benchmarks.peers.pgqueuer_app import ENTRYPOINT, STARTS_KEY, connect, consumer
from benchmarks.rig import IDLE_SETTLE, REPO, Rig, paced, rig, wait_until
from outbox.dispatch.processes import OutboxProcess

#: pgqueuer's benchmark tool: concurrent dequeue tasks (its default), and the batch size.
CONSUMERS = 5
BATCH_SIZE = 100


def _nothing() -> None:
    pass


async def _install(schema: str) -> None:
    q, conn = await connect(schema)
    await q.install()
    await conn.close()


async def _drain(schema: str, n: int) -> tuple[float, int, dict[str, float | None]]:
    """Seconds from the first job's start to the last job's end, how many jobs ran, and the CPU
    ms a job of this process and of PostgreSQL over the drain (its consumers' connections still
    open), as ``inprocess`` reports its own.

    The clock leaves out the consumers' start (a structure check, LISTEN) and their drain exit
    (their last look for work), which pgqueuer's own tool counts."""
    await _install(schema)
    await _enqueue(schema, n)
    cpu = CpuMeter(client=os.getpid())
    seconds, ran = await _consume(schema, on_start=cpu.start, on_end=cpu.stop)
    return seconds, ran, cpu.per_action_ms(n)


async def _enqueue(schema: str, n: int) -> None:
    """``n`` no-op jobs in one call, as pgqueuer's benchmark tool enqueues them."""
    q, conn = await connect(schema)
    await q.enqueue([ENTRYPOINT] * n, [b""] * n, [0] * n)
    await conn.close()


async def _consume(
    schema: str, on_start: Callable[[], None] = _nothing, on_end: Callable[[], None] = _nothing
) -> tuple[float, int]:
    """``CONSUMERS`` consumers drain the queue: seconds from the first job's start to the last
    job's end, and how many jobs ran. ``on_start`` and ``on_end`` run just before the consumers
    start and just after the last has stopped (their connections still open)."""
    ran = 0
    first_start = last_end = 0.0
    connections = []
    consumers = []
    for _ in range(CONSUMERS):
        q, conn = await connect(schema)
        connections.append(conn)
        pgq = consumer(q, schema)

        @pgq.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            nonlocal ran, first_start, last_end
            if not ran:
                first_start = time.perf_counter()
            ran += 1
            last_end = time.perf_counter()

        consumers.append(pgq)
    on_start()
    await asyncio.gather(
        *(pgq.run(batch_size=BATCH_SIZE, mode=QueueExecutionMode.drain) for pgq in consumers)
    )
    on_end()
    for conn in connections:
        await conn.close()
    return last_end - first_start, ran


def drain(n: int) -> Result:
    """One drain of ``n`` jobs in a schema of its own: the ``pgqueuer-inprocess`` row."""
    with bench_schema("pgqueuer_inprocess") as schema:
        seconds, ran, cpu = uvloop.run(_drain(schema, n))
    if ran != n:
        raise AssertionError(f"pgqueuer-inprocess: {ran} of {n} jobs ran")
    return Result(
        scenario="pgqueuer-inprocess",
        n=n,
        actions_per_s=round(n / seconds, 1),
        p50_ms=None,
        p99_ms=None,
        ratio=1.0,
        ratio_to="pgqueuer-inprocess",
        extra={
            "driver": "psycopg",
            "consumers": CONSUMERS,
            "batch_size": BATCH_SIZE,
            "strategy": "drain (pgqueuer's benchmark tool)",
            "clock": "first job start -> last job end",
            **cpu,
        },
    )


def run_inprocess(scale: Scale) -> list[Result]:
    return [drain(inprocess.n_actions(scale))]


async def _horizon_side(
    held: bool, batches: int, per_batch: int
) -> tuple[list[float], float, float]:
    """One side of ``pgqueuer-horizon`` in a schema of its own: each batch's jobs a second, how
    long the snapshot was held, and the rate of the batch drained after it was let go."""
    name = "pgqueuer_horizon_held" if held else "pgqueuer_horizon_free"
    with bench_schema(name) as schema, horizon.holder_connection(held) as holder:
        await _install(schema)
        started = time.perf_counter()
        if holder is not None:
            horizon.hold_snapshot(holder)
        rates: list[float] = []
        held_s = 0.0
        for _ in range(batches + 1):
            await _enqueue(schema, per_batch)
            if len(rates) == batches and holder is not None:
                held_s = time.perf_counter() - started
                holder.rollback()  # the batch after the last drains with nothing held
            seconds, ran = await _consume(schema)
            if ran != per_batch:
                raise AssertionError(f"pgqueuer-horizon: {ran} of {per_batch} jobs ran")
            rates.append(per_batch / seconds)
    return rates[:-1], held_s, rates[-1]


def run_horizon(scale: Scale) -> list[Result]:
    batches, per_batch = horizon.sizes(scale)
    free, _, _ = uvloop.run(_horizon_side(False, batches, per_batch))
    held, held_s, released = uvloop.run(_horizon_side(True, batches, per_batch))
    return [
        Result(
            scenario="pgqueuer-horizon",
            n=batches * per_batch,
            actions_per_s=round(horizon.late_rate(held), 1),
            p50_ms=None,
            p99_ms=None,
            ratio=round(horizon.late_rate(held) / horizon.late_rate(free), 3),
            ratio_to="pgqueuer-horizon-free",
            extra={
                "batches": batches,
                "per_batch": per_batch,
                "consumers": CONSUMERS,
                "batch_size": BATCH_SIZE,
                "held_s": round(held_s, 1),
                "held_per_s": [round(rate) for rate in held],
                "free_per_s": [round(rate) for rate in free],
                "released_per_s": round(released),
            },
        )
    ]


async def _enqueue_paced(schema: str, n: int) -> dict[int, float]:
    q, conn = await connect(schema)
    committed: dict[int, float] = {}
    for _ in paced(n, dramatiq_raw.PACE):
        (job_id,) = await q.enqueue(ENTRYPOINT, b"")
        committed[int(job_id)] = time.time()
    await conn.close()
    return committed


def _start_consumer(r: Rig, schema: str) -> int:
    """The latency scenario's consumer process, installed and listening: its pid."""
    uvloop.run(_install(schema))
    argv = [sys.executable, "-m", pgqueuer_app.__name__, schema]
    proc = OutboxProcess(argv, r.env(), cwd=REPO)
    r.stack.callback(proc.close)
    proc.wait_for(pgqueuer_app.READY, timeout=60)
    time.sleep(IDLE_SETTLE * 2)  # its LISTEN is up a moment after the entrypoint
    return proc.pid


def run_latency(scale: Scale) -> list[Result]:
    n = scale.n(300, 3_000, floor=20)  # as ``latency``
    with bench_schema("pgqueuer_latency") as schema, rig(schema) as r:
        _start_consumer(r, schema)
        committed = uvloop.run(_enqueue_paced(schema, n))
        with redis.Redis.from_url(REDIS_URL) as client:
            wait_until(lambda: client.hlen(STARTS_KEY) >= n, 60, "pgqueuer jobs not started")
            starts = {int(k): float(v) for k, v in client.hgetall(STARTS_KEY).items()}
    return [latency_result("pgqueuer-latency", committed, starts, {"batch_size": 10})]


def run_idle(scale: Scale) -> list[Result]:
    with bench_schema("pgqueuer_idle") as schema, rig(schema) as r:
        consumer = _start_consumer(r, schema)
        layout = {"processes": 1, "batch_size": 10}
        return [idle.watched("pgqueuer-idle", idle.Watch.of(scale), layout, consumer=consumer)]


def latency_result(
    scenario: str, committed: dict[int, float], starts: dict[int, float], settings: dict
) -> Result:
    """A peer's latency row: p50/p99 of commit -> start, ``ratio`` 1 (the peer is its own
    reference; ``latency-vs-<peer>`` compares)."""
    latencies = [starts[i] - t for i, t in committed.items()]
    return Result(
        scenario=scenario,
        n=len(latencies),
        actions_per_s=round(dramatiq_raw.PACE, 1),
        p50_ms=ms(percentile(latencies, 50)),
        p99_ms=ms(percentile(latencies, 99)),
        ratio=1.0,
        ratio_to=scenario,
        extra={
            "max_ms": ms(max(latencies)),
            "latency_is": "enqueue commit returned -> job start",
            **settings,
        },
    )
