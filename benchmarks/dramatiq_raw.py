"""``dramatiq-raw``: N no-op messages through the same broker and worker settings as the outbox,
without the outbox: the ceiling of ``e2e`` (and, paced at 100/s, of ``latency``).

The clock runs from the first send until the last actor counted itself done (a Redis INCR,
the raw actor's only work). Measured once per run and broker (Redis; RabbitMQ for the
``rabbitmq`` scenarios) and shared with the scenarios it bounds.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import redis

from benchmarks import apps
from benchmarks.common import REDIS_URL, Result, Scale, ms, percentile
from benchmarks.cpu import CpuMeter
from benchmarks.rig import (
    IDLE_SETTLE,
    IN_FLIGHT,
    PROCESSES,
    THREADS,
    WORKER_TIMEOUT_MS,
    broker_settings,
    paced,
    rig,
    services_for,
    wait_until,
)

#: Messages a second of the paced (latency) run.
PACE = 100.0


@dataclass(frozen=True)
class RawCeiling:
    n: int
    per_s: float
    latency_n: int
    latencies: list[float]
    cpu_ms: dict[str, float | None]


_measured: dict[tuple[Scale, str], RawCeiling] = {}


@dataclass(frozen=True)
class RawThroughput:
    per_s: float
    cpu_ms: dict[str, float | None]


def throughput(
    n: int, broker_url: str = REDIS_URL, body: Callable[[int], str] | None = None
) -> RawThroughput:
    """``n`` messages sent one by one through a fresh raw pool on ``broker_url``, as fast as the
    pool takes them: messages/s from the first send until the last actor counted itself done.
    ``body``: the text the ``i``-th message carries besides (none by default)."""
    actor = apps.raw_broker_at(broker_url).get_actor("bench_raw_noop")
    with rig("raw", **broker_settings(broker_url)) as r:
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        workers = r.raw_workers().pid
        cpu = CpuMeter(services_for(broker_url), workers=workers, sender=os.getpid())
        cpu.start()
        started = time.perf_counter()
        for i in range(n):
            if body is None:
                actor.send()
            else:
                actor.send(None, body(i))
        ended = wait_until(
            lambda: int(client.get(apps.RAW_DONE_KEY) or 0) >= n, 300, "raw messages not done"
        )
        cpu.stop()
    return RawThroughput(n / (ended - started), cpu.per_action_ms(n))


def raw_n(scale: Scale) -> int:
    return scale.n(6_000, 30_000, floor=50)


def measure(scale: Scale, broker_url: str = REDIS_URL) -> RawCeiling:
    """Runs the raw pool once per run and broker (later calls return the same numbers)."""
    if (scale, broker_url) in _measured:
        return _measured[scale, broker_url]
    n = raw_n(scale)
    paced_n = scale.n(300, 3_000, floor=20)
    ceiling = throughput(n, broker_url)
    actor = apps.raw_broker_at(broker_url).get_actor("bench_raw_noop")
    with rig("raw", **broker_settings(broker_url)) as r:
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        r.raw_workers()
        time.sleep(IDLE_SETTLE)  # idle, as the latency scenario's pool is
        for _ in paced(paced_n, PACE):
            actor.send(time.time())
        wait_until(lambda: int(client.get(apps.RAW_DONE_KEY) or 0) >= paced_n, 60, "paced")
        latencies = [float(v) for v in client.lrange(apps.RAW_LATENCY_KEY, 0, -1)]
    _measured[scale, broker_url] = RawCeiling(n, ceiling.per_s, paced_n, latencies, ceiling.cpu_ms)
    return _measured[scale, broker_url]


def run(scale: Scale) -> list[Result]:
    return [result(measure(scale), "dramatiq-raw")]


def result(raw: RawCeiling, scenario: str) -> Result:
    """The raw pool's row: its throughput, and its paced latency as p50/p99."""
    return Result(
        scenario=scenario,
        n=raw.n,
        actions_per_s=round(raw.per_s, 1),
        p50_ms=ms(percentile(raw.latencies, 50)),
        p99_ms=ms(percentile(raw.latencies, 99)),
        ratio=1.0,
        ratio_to=scenario,
        extra={
            "processes": PROCESSES,
            "threads": THREADS,
            "in_flight": IN_FLIGHT,
            "worker_timeout_ms": WORKER_TIMEOUT_MS,
            **raw.cpu_ms,
            "latency_is": f"send to actor start, {raw.latency_n} messages at {PACE:.0f}/s",
        },
    )
