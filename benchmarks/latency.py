"""``latency``: actions enqueued one a transaction at about 100/s while the claimer and the
workers are idle; the time from the enqueue's commit (when ``commit()`` returned) to the
adapter's start (its first line, wall clock; same machine), p50 and p99. ``ratio`` is p50 over
``dramatiq-raw``'s p50 for messages sent at the same pace to the same pool.

``latency-8-kinds``: the same while the claimer and the workers serve seven more kinds that
never get an action (an application's other kinds, idle at the moment): what serving many kinds
costs one kind's latency.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
import redis

from benchmarks import apps, dramatiq_raw, server_time
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
from benchmarks.cpu import CpuMeter
from benchmarks.rig import paced, rig, services_for, wait_until

#: Kinds the claimer and the workers serve in ``latency-8-kinds`` (the no-op kind and 7 idle).
KINDS = 8


def run(scale: Scale) -> list[Result]:
    raw = dramatiq_raw.measure(scale)
    n = scale.n(300, 3_000, floor=20)
    results = [result("latency", *latencies_of(n, "latency"), raw.latencies)]
    idle = {"BENCH_IDLE_KINDS": str(KINDS - 1)}
    results.append(
        result(f"latency-{KINDS}-kinds", *latencies_of(n, "latency8", **idle), raw.latencies)
    )
    return results


def latencies_of(n: int, name: str, **settings: str) -> tuple[list[float], dict[str, Any]]:
    """Enqueue commit -> adapter start of ``n`` actions at ``dramatiq_raw.PACE`` to an idle
    pool whose claimer and workers run with ``settings`` in their environment, and the CPU ms
    an action of each process and service meanwhile (what an action costs at a modest pace,
    where nothing is batched: a claim round, a take, a fence and a finish each), with the
    server time an action of each of the outbox's SQL functions (``server_functions``, over
    the whole run: the actions' finishes included)."""
    committed: dict[int, float] = {}
    with bench_schema(name) as schema:
        tracked = server_time.tracking(schema)
        with rig(schema, BENCH_RECORD_STARTS="1", **tracked, **settings) as r:
            outbox = migrated_outbox(schema)
            with settings_env(settings):
                for kind in apps.idle_kinds():
                    outbox.declare(kind)
            outbox.migrate()
            client = redis.Redis.from_url(REDIS_URL)
            r.stack.callback(client.close)
            services = services_for(settings.get("OUTBOX_BROKER_URL", REDIS_URL))
            cpu = CpuMeter(services, enqueuer=os.getpid(), **r.idle_outbox())
            options = server_time.session_options(schema, tracked)
            with psycopg.connect(DATABASE_URL, **options) as conn:
                cpu.start()
                for i in paced(n, dramatiq_raw.PACE):
                    action = outbox.enqueue(
                        conn,
                        noop_request(f"{name}-{i}", f"lane-{i}", i),
                    )
                    conn.commit()
                    committed[action.id] = time.time()
            wait_until(lambda: client.hlen(apps.STARTS_KEY) >= n, 60, "latency actions not started")
            cpu.stop()
            starts = {int(k): float(v) for k, v in client.hgetall(apps.STARTS_KEY).items()}
            phases = _phases(schema, committed, starts)
        # After the processes ended: their sessions hand their counts over as they end.
        functions = server_time.per_action(schema, n, tracked)
    measured: dict[str, Any] = {
        **cpu.per_action_ms(n),
        **phases,
        "server_functions": functions,
    }
    return [starts[i] - t for i, t in committed.items()], measured


def _phases(
    schema: str, committed: dict[int, float], starts: dict[int, float]
) -> dict[str, float | None]:
    """Where an action's latency goes, p50 of each span: the enqueue's commit -> its claim
    (the NOTIFY, the claimer's wake-up, the round's opening query), the claim -> the take (the
    claim's statement and commit, the push, the broker, the worker's wake-up and its take
    statement's start), the take -> the adapter's start (the take's statement, its commit, the
    executor's hand-over). The database clock and the wall clock are the same machine's."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        first = first_attempts(conn, schema)
    spans: dict[str, list[float]] = {name: [] for name in PHASES}
    for action_id, (claimed, taken) in first.items():
        if action_id not in committed or action_id not in starts:
            continue
        spans["commit_to_claim_p50_ms"].append(claimed - committed[action_id])
        spans["claim_to_take_p50_ms"].append(taken - claimed)
        spans["take_to_start_p50_ms"].append(starts[action_id] - taken)
    return {name: ms(percentile(v, 50)) if v else None for name, v in spans.items()}


#: The spans ``_phases`` reports, in the order an action crosses them.
PHASES = ("commit_to_claim_p50_ms", "claim_to_take_p50_ms", "take_to_start_p50_ms")


def result(
    scenario: str,
    latencies: list[float],
    cpu_ms: dict[str, Any],
    raw_latencies: list[float],
    ratio_to: str = "dramatiq-raw-latency-p50",
) -> Result:
    p50, raw_p50 = percentile(latencies, 50), percentile(raw_latencies, 50)
    return Result(
        scenario=scenario,
        n=len(latencies),
        actions_per_s=round(dramatiq_raw.PACE, 1),
        p50_ms=ms(p50),
        p99_ms=ms(percentile(latencies, 99)),
        ratio=round(p50 / raw_p50, 3) if raw_p50 > 0 else None,
        ratio_to=ratio_to,
        extra={
            "ceiling_p50_ms": ms(raw_p50),
            "ceiling_p99_ms": ms(percentile(raw_latencies, 99)),
            "max_ms": ms(max(latencies)),
            "kinds_served": KINDS if scenario.startswith(f"latency-{KINDS}") else 1,
            "latency_is": "enqueue commit returned -> adapter start",
            **cpu_ms,
        },
    )


@contextmanager
def settings_env(settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in this process's environment for the block (``apps.idle_kinds`` reads it)."""
    saved = {key: os.environ.get(key) for key in settings}
    os.environ.update(settings)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
