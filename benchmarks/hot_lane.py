"""``hot-lane``: N actions of ONE lane, enqueued in one transaction while the claimer and the
workers are idle. A lane runs one action at a time, so each next action waits for its
predecessor's finish, a claim, a push and a take: the lane's throughput is one dispatch round
trip an action. p50/p99 are the steps between consecutive finishes (database clock); ``ratio``
is the step's p50 over ``dramatiq-raw``'s p50 latency (send -> actor start) at an idle pool: how
many plain Dramatiq hops one step of a lane costs.
"""

from __future__ import annotations

import itertools
import time

import psycopg

from benchmarks import dramatiq_raw
from benchmarks.common import (
    DATABASE_URL,
    Result,
    Scale,
    all_ended,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.rig import rig, wait_until


def run(scale: Scale) -> list[Result]:
    raw = dramatiq_raw.measure(scale)
    n = scale.n(200, 1_000, floor=20)
    with bench_schema("hot_lane") as schema, rig(schema) as r:
        outbox = migrated_outbox(schema)
        r.idle_outbox()
        table = f'"{schema}".agent_action'
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            with psycopg.connect(DATABASE_URL) as conn:
                requests = [noop_request(f"hot-{i}", "the-hot-lane", i) for i in range(n)]
                outbox.enqueue_many(conn, requests)
                conn.commit()
            started = time.perf_counter()
            done_at = wait_until(
                lambda: all_ended(watch, schema), 600, "hot-lane actions not ended", 0.02
            )
            rows = watch.execute(
                f"SELECT state, extract(epoch FROM ended_at)::float8 FROM {table} ORDER BY id"
            ).fetchall()
    states = {state for state, _ in rows}
    if states != {"DONE"}:
        raise AssertionError(f"hot-lane: not every action ended DONE: {states}")
    ends = [end for _, end in rows]
    if ends != sorted(ends):
        raise AssertionError("hot-lane: the lane's actions did not end in id order")
    steps = [later - earlier for earlier, later in itertools.pairwise(ends)]
    step_p50, raw_p50 = percentile(steps, 50), percentile(raw.latencies, 50)
    return [
        Result(
            scenario="hot-lane",
            n=n,
            actions_per_s=round(n / (done_at - started), 1),
            p50_ms=ms(step_p50),
            p99_ms=ms(percentile(steps, 99)),
            ratio=round(step_p50 / raw_p50, 3) if raw_p50 > 0 else None,
            ratio_to="dramatiq-raw-latency-p50",
            extra={
                "latency_is": "one finish -> the next finish of the lane, database clock",
                "ceiling_p50_ms": ms(raw_p50),
            },
        )
    ]
