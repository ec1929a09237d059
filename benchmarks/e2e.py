"""``e2e``: N no-op actions enqueued (100 a transaction), claimed by a real ``outbox claimer``,
pushed through Dramatiq on Redis, run by a real ``outbox worker`` pool with the fence, and
finished, every guarantee on. The clock runs from the first enqueue until the last action is
DONE in PostgreSQL; p50/p99 are each action's time from its enqueue transaction's start to
its finish (database clock), under that load. ``ratio`` = e2e / ``dramatiq-raw`` (same broker,
same pool, same run).
"""

from __future__ import annotations

import os
import time

import psycopg

from benchmarks import dramatiq_raw
from benchmarks.common import (
    DATABASE_URL,
    Result,
    Scale,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.cpu import CpuMeter
from benchmarks.rig import rig, wait_until

#: Actions per enqueueing transaction (an application's batch job, say).
PER_TX = 100


def run(scale: Scale) -> list[Result]:
    raw = dramatiq_raw.measure(scale)
    n = scale.n(3_000, 20_000, floor=50)
    with bench_schema("e2e") as schema, rig(schema) as r:
        outbox = migrated_outbox(schema)
        cpu = CpuMeter(
            workers=r.outbox_workers().pid, claimer=r.claimer().pid, enqueuer=os.getpid()
        )
        cpu.start()
        tx_seconds: list[float] = []
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            ended_sql = f'SELECT count(*) FROM "{schema}".agent_action WHERE ended_at IS NOT NULL'

            def ended() -> int:
                return watch.execute(ended_sql).fetchone()[0]

            started = time.perf_counter()
            with psycopg.connect(DATABASE_URL) as conn:
                for i in range(n):
                    outbox.enqueue(
                        conn,
                        noop_request(f"e2e-{i}", f"lane-{i}", i),
                    )
                    if i % PER_TX == PER_TX - 1 or i == n - 1:
                        before = time.perf_counter()
                        conn.commit()
                        tx_seconds.append(time.perf_counter() - before)
            enqueued = time.perf_counter()
            done_at = wait_until(lambda: ended() >= n, 600, "e2e actions not ended", 0.02)
            cpu.stop()
            states = dict(
                watch.execute(
                    f'SELECT state, count(*) FROM "{schema}".agent_action GROUP BY state'
                ).fetchall()
            )
            (max_attempt,) = watch.execute(
                f'SELECT max(attempt) FROM "{schema}".agent_action'
            ).fetchone()
            # Time in the system by the database clock: enqueue transaction start -> finish.
            in_system = [
                row[0]
                for row in watch.execute(
                    "SELECT extract(epoch FROM ended_at - created_at)::float8"
                    f' FROM "{schema}".agent_action'
                )
            ]
    rate = n / (done_at - started)
    if states != {"DONE": n}:
        raise AssertionError(f"e2e: not every action ended DONE: {states}")
    return [
        Result(
            scenario="e2e",
            n=n,
            actions_per_s=round(rate, 1),
            p50_ms=ms(percentile(in_system, 50)),
            p99_ms=ms(percentile(in_system, 99)),
            ratio=round(rate / raw.per_s, 3),
            ratio_to="dramatiq-raw",
            extra={
                "ceiling_per_s": round(raw.per_s, 1),
                "latency_is": "enqueue transaction start -> DONE, database clock, under load",
                "enqueue_s": round(enqueued - started, 2),
                "commit_p50_ms": ms(percentile(tx_seconds, 50)),
                "max_attempt": max_attempt,
                "states": states,
                **cpu.per_action_ms(n),
            },
        )
    ]
