"""``priority``, ``fair`` and ``rate``: the claim's priority within a kind, its fairness between
workspaces, and the shared rate limiter, on real claimer and worker processes.

- ``priority``: 100,000 bulk actions (priority 0) wait; while the pool works through them,
  transactional actions (priority 50) are enqueued one a transaction at 10/s. p50/p99: enqueue
  commit -> adapter start of the transactional ones.
- ``fair``: workspace A's 100,000 actions wait; workspace B's single actions are enqueued one a
  transaction at 5/s while the pool works through A's. p50/p99: enqueue commit -> adapter start
  of B's.
- ``rate``: one kind limited to 50/s (``OUTBOX_LIMITS``), 2 claimers, 2 worker processes; the
  rate and the most calls in any 1-second window, counted at the "provider" (the adapter's call,
  right after its fence, wall clock); then the same with Dramatiq's own sliding-window limiter
  on Redis instead (``rate-dramatiq``: a refused acquire defers the action 50 ms), to compare.
"""

from __future__ import annotations

import bisect
import itertools
import time
from typing import Any

import psycopg
import redis

from benchmarks import apps
from benchmarks.common import (
    DATABASE_URL,
    NOOP,
    REDIS_URL,
    Result,
    Scale,
    all_ended,
    bench_schema,
    ended_count,
    migrated_outbox,
    ms,
    percentile,
)
from benchmarks.rig import paced, rig, wait_until
from outbox import ActionRequest, Outbox

#: The issue's backlog.
BACKLOG = 100_000
#: The rate limit of the ``rate`` scenario, a second.
RATE = 50
#: The issue's goal for a single action's start behind the backlog.
GOAL_S = 1.0


def _request(key: str, workspace: str, *, priority: int = 0, record: bool = False) -> Any:
    return ActionRequest(
        kind=NOOP.name,
        workspace_id=workspace,
        lane_key=key,
        idempotency_key=key,
        payload={"record": True} if record else {},
        priority=priority,
    )


def fill_backlog(outbox: Outbox, n: int, workspace: str = "w") -> None:
    """``n`` bulk actions, one lane each, in transactions of 1,000 (a newsletter)."""
    with psycopg.connect(DATABASE_URL) as conn:
        for start in range(0, n, 1000):
            batch = [_request(f"bulk-{i}", workspace) for i in range(start, min(n, start + 1000))]
            outbox.enqueue_many(conn, batch)
            conn.commit()


def _paced_singles(
    outbox: Outbox, n: int, per_second: float, workspace: str, priority: int
) -> dict[int, float]:
    committed: dict[int, float] = {}
    with psycopg.connect(DATABASE_URL) as conn:
        for i in paced(n, per_second):
            request = _request(f"single-{i}", workspace, priority=priority, record=True)
            action = outbox.enqueue(conn, request)
            conn.commit()
            committed[action.id] = time.time()
    return committed


def _starts(client: redis.Redis, n: int) -> dict[int, float]:
    wait_until(lambda: client.hlen(apps.STARTS_KEY) >= n, 120, "recorded actions not started")
    return {int(k): float(v) for k, v in client.hgetall(apps.STARTS_KEY).items()}


def _backlog_left(schema: str) -> int:
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        row = conn.execute(
            f"SELECT count(*) FROM \"{schema}\".agent_action WHERE state = 'ADMITTED'"
        ).fetchone()
    return row[0] if row else 0


def _single_behind_backlog(
    scale: Scale, name: str, *, priority: int, backlog_workspace: str, single_workspace: str
) -> Result:
    backlog = scale.n(BACKLOG, BACKLOG, floor=500)
    n = scale.n(30, 100, floor=5)
    pace = 10.0 if priority else 5.0
    with bench_schema(name) as schema, rig(schema) as r:
        outbox = migrated_outbox(schema)
        fill_backlog(outbox, backlog, backlog_workspace)
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        r.outbox_workers()
        r.claimer()
        # The pool is busy with the backlog before the first single action comes.
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            wait_until(
                lambda: ended_count(watch, schema) >= backlog // 20, 300, f"{name}: no progress"
            )
        committed = _paced_singles(outbox, n, pace, single_workspace, priority)
        left = _backlog_left(schema)
        starts = _starts(client, n)
    latencies = [starts[i] - t for i, t in committed.items()]
    return Result(
        scenario=name,
        n=n,
        actions_per_s=pace,
        p50_ms=ms(percentile(latencies, 50)),
        p99_ms=ms(percentile(latencies, 99)),
        ratio=round(percentile(latencies, 99) / GOAL_S, 3),
        ratio_to="goal-p99-1s",
        extra={
            "backlog": backlog,
            "backlog_left_when_the_last_was_enqueued": left,
            "max_ms": ms(max(latencies)),
            "goal": "p99 <= 1000 ms",
        },
    )


def run_priority(scale: Scale) -> list[Result]:
    return [
        _single_behind_backlog(
            scale, "priority", priority=50, backlog_workspace="w", single_workspace="w"
        )
    ]


def run_fair(scale: Scale) -> list[Result]:
    return [
        _single_behind_backlog(
            scale, "fair", priority=0, backlog_workspace="big", single_workspace="small"
        )
    ]


def max_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` in any half-open window [t, t + window)."""
    ordered = sorted(times)
    return max(
        (bisect.bisect_left(ordered, t + window) - i for i, t in enumerate(ordered)), default=0
    )


def _rate(scale: Scale, name: str, settings: dict[str, str]) -> Result:
    n = scale.n(RATE * 12, RATE * 40, floor=RATE)
    with bench_schema(name.replace("-", "_")) as schema, rig(schema, **settings) as r:
        outbox = migrated_outbox(schema)
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        r.outbox_workers()
        r.claimer()
        r.claimer()
        fill_backlog(outbox, n)
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            wait_until(lambda: all_ended(watch, schema), 600, f"{name}: not ended", 0.1)
            attempts = watch.execute(
                f'SELECT max(attempt), sum(epoch)::bigint FROM "{schema}".agent_action'
            ).fetchone()
        calls = sorted(float(v) for v in client.hgetall(apps.CALLS_KEY).values())
    span = calls[-1] - calls[0]
    rate = (len(calls) - 1) / span if span > 0 else 0.0
    gaps = [later - earlier for earlier, later in itertools.pairwise(calls)]
    return Result(
        scenario=name,
        n=len(calls),
        actions_per_s=round(rate, 2),
        # The gaps between consecutive calls at the provider (1000 / limit when evenly spaced).
        p50_ms=ms(percentile(gaps, 50)),
        p99_ms=ms(percentile(gaps, 99)),
        ratio=round(rate / RATE, 3),
        ratio_to="limit",
        extra={
            "limit_per_s": RATE,
            "accuracy_pct": round(100 * (rate - RATE) / RATE, 2),
            "max_calls_in_any_1s_window": max_in_window(calls, 1.0),
            "max_attempt": int(attempts[0]) if attempts else None,
            "claims": int(attempts[1]) if attempts else None,
            "goal": f"{RATE}/s +-5%, never more than {RATE} in any 1-s window",
        },
    )


def run_rate(scale: Scale) -> list[Result]:
    results = [
        _rate(
            scale,
            "rate",
            {"OUTBOX_LIMITS": f"{NOOP.name}: rate={RATE}/s", "BENCH_RECORD_CALLS": "1"},
        )
    ]
    results.append(
        _rate(
            scale,
            "rate-dramatiq",
            {"BENCH_LIMITER": f"dramatiq-window:{RATE}", "BENCH_RECORD_CALLS": "1"},
        )
    )
    return results
