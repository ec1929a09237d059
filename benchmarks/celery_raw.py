"""``celery-raw``: N no-op Celery tasks through the same broker and worker settings as the
outbox's Celery fabric, without the outbox: the ceiling of ``e2e-celery``.

Same worker layout as every pool (``PROCESSES`` Celery workers of ``THREADS`` threads), the
outbox's Celery app settings and task options (acks_late, prefetch 1, JSON, no results). The
clock runs from the first publish until the last task counted itself done (a Redis INCR).
Latency: publish to task start, paced at 100/s on an idle pool.
"""

from __future__ import annotations

import os
import time

import redis

from benchmarks import apps
from benchmarks.common import REDIS_URL, Result, Scale, ms, percentile
from benchmarks.cpu import CpuMeter
from benchmarks.dramatiq_raw import PACE, RawCeiling, RawThroughput, raw_n
from benchmarks.rig import IDLE_SETTLE, IN_FLIGHT, PROCESSES, THREADS, paced, rig, wait_until

_measured: dict[Scale, RawCeiling] = {}


def _task():  # type: ignore[no-untyped-def]
    from benchmarks.celery_apps import RAW_QUEUE, raw_task

    return raw_task, RAW_QUEUE


def throughput(n: int) -> RawThroughput:
    """``n`` tasks published one by one through a fresh raw pool: tasks/s from the first
    publish until the last task counted itself done."""
    task, queue = _task()
    with rig("celeryraw") as r:
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        pids = r.raw_celery_workers(queue)
        cpu = CpuMeter(sender=os.getpid(), **{f"workers{i}": pid for i, pid in enumerate(pids)})
        cpu.start()
        started = time.perf_counter()
        with task.app.producer_or_acquire() as producer:
            for _ in range(n):
                task.apply_async(queue=queue, producer=producer)
        ended = wait_until(
            lambda: int(client.get(apps.RAW_DONE_KEY) or 0) >= n, 300, "raw tasks not done"
        )
        cpu.stop()
    return RawThroughput(n / (ended - started), cpu.per_action_ms(n))


def measure(scale: Scale) -> RawCeiling:
    """Runs the raw pool once per run (later calls return the same numbers)."""
    if scale in _measured:
        return _measured[scale]
    n = raw_n(scale)
    paced_n = scale.n(300, 3_000, floor=20)
    ceiling = throughput(n)
    task, queue = _task()
    with rig("celeryraw") as r:
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        r.raw_celery_workers(queue)
        time.sleep(IDLE_SETTLE)
        for _ in paced(paced_n, PACE):
            task.apply_async(args=(time.time(),), queue=queue)
        wait_until(lambda: int(client.get(apps.RAW_DONE_KEY) or 0) >= paced_n, 60, "paced")
        latencies = [float(v) for v in client.lrange(apps.RAW_LATENCY_KEY, 0, -1)]
    _measured[scale] = RawCeiling(n, ceiling.per_s, paced_n, latencies, ceiling.cpu_ms)
    return _measured[scale]


def run(scale: Scale) -> list[Result]:
    raw = measure(scale)
    return [
        Result(
            scenario="celery-raw",
            n=raw.n,
            actions_per_s=round(raw.per_s, 1),
            p50_ms=ms(percentile(raw.latencies, 50)),
            p99_ms=ms(percentile(raw.latencies, 99)),
            ratio=1.0,
            ratio_to="celery-raw",
            extra={
                "processes": PROCESSES,
                "threads": THREADS,
                "pool": "threads",
                "in_flight": IN_FLIGHT,
                **raw.cpu_ms,
                "latency_is": f"publish to task start, {raw.latency_n} tasks at {PACE:.0f}/s",
            },
        )
    ]
