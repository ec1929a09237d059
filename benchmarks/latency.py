"""``latency``: actions enqueued one a transaction at about 100/s while the claimer and the
workers are idle; the time from the enqueue's commit (when ``commit()`` returned) to the
adapter's start (its first line, wall clock; same machine), p50 and p99. ``ratio`` is p50 over
``dramatiq-raw``'s p50 for messages sent at the same pace to the same pool.
"""

from __future__ import annotations

import time

import psycopg
import redis

from benchmarks import apps, dramatiq_raw
from benchmarks.common import (
    DATABASE_URL,
    REDIS_URL,
    Result,
    Scale,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.rig import paced, rig, wait_until


def run(scale: Scale) -> list[Result]:
    raw = dramatiq_raw.measure(scale)
    n = scale.n(300, 3_000, floor=20)
    committed: dict[int, float] = {}
    with bench_schema("latency") as schema, rig(schema, BENCH_RECORD_STARTS="1") as r:
        outbox = migrated_outbox(schema)
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        r.idle_outbox()
        with psycopg.connect(DATABASE_URL) as conn:
            for i in paced(n, dramatiq_raw.PACE):
                action = outbox.enqueue(
                    conn,
                    noop_request(f"latency-{i}", f"lane-{i}", i),
                )
                conn.commit()
                committed[action.id] = time.time()
        wait_until(lambda: client.hlen(apps.STARTS_KEY) >= n, 60, "latency actions not started")
        starts = {int(k): float(v) for k, v in client.hgetall(apps.STARTS_KEY).items()}
    latencies = [starts[i] - t for i, t in committed.items()]
    p50, raw_p50 = percentile(latencies, 50), percentile(raw.latencies, 50)
    return [
        Result(
            scenario="latency",
            n=n,
            actions_per_s=round(dramatiq_raw.PACE, 1),
            p50_ms=ms(p50),
            p99_ms=ms(percentile(latencies, 99)),
            ratio=round(p50 / raw_p50, 3) if raw_p50 > 0 else None,
            ratio_to="dramatiq-raw-latency-p50",
            extra={
                "ceiling_p50_ms": ms(raw_p50),
                "ceiling_p99_ms": ms(percentile(raw.latencies, 99)),
                "max_ms": ms(max(latencies)),
                "latency_is": "enqueue commit returned -> adapter start",
            },
        )
    ]
