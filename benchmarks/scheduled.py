"""``scheduled``: how late scheduled actions start. N actions, each on a lane of its own, are
enqueued at once with a ``not_before`` each, spread evenly over the next N / 100 seconds (100 come
due a second, as ``latency``'s pace), 2 s after the enqueue; a real claimer and worker pool of the
common layout are idle meanwhile. p50/p99 are each action's lateness: its adapter's start (wall
clock) after its ``not_before`` (the same machine's clock). ``ratio`` is the p50 over the
claimer's ``poll_interval``: a claimer that found a scheduled action only at its poll would start
it half a poll late on average.

``scheduled-sparse``: the same with one action due every 0.37 s (a reminder now and then), so
that each finds the claimer idle, with nothing in flight (0.37 s, not a divisor of the poll, lands
on every phase of it).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import psycopg
import redis

from benchmarks import apps
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
from benchmarks.rig import rig, wait_until
from outbox.config import Settings

#: Actions coming due a second (``latency``'s pace), and the wait before the first.
PACE = 100.0
LEAD = timedelta(seconds=2)
#: The gap between two actions' times in ``scheduled-sparse``.
SPARSE_GAP = 0.37


def run(scale: Scale) -> list[Result]:
    poll = Settings().poll_interval.total_seconds()
    dense = scale.n(300, 1_000, floor=20)
    sparse = scale.n(20, 50, floor=4)
    return [
        result("scheduled", lateness_of(dense, 1 / PACE), 1 / PACE, poll),
        result("scheduled-sparse", lateness_of(sparse, SPARSE_GAP), SPARSE_GAP, poll),
    ]


def result(scenario: str, lateness: list[float], gap: float, poll: float) -> Result:
    """The row of actions due ``gap`` seconds apart (``actions_per_s``: the rate they come
    due)."""
    p50 = percentile(lateness, 50)
    return Result(
        scenario=scenario,
        n=len(lateness),
        actions_per_s=round(1 / gap, 1),
        p50_ms=ms(p50),
        p99_ms=ms(percentile(lateness, 99)),
        ratio=round(p50 / poll, 3),
        ratio_to="poll-interval",
        extra={
            "poll_interval_ms": ms(poll),
            "max_ms": ms(max(lateness)),
            "early": sum(1 for late in lateness if late < 0),
            "latency_is": "not_before -> adapter start",
        },
    )


def lateness_of(n: int, gap: float) -> list[float]:
    """Seconds from each action's ``not_before`` to its adapter's start, for ``n`` actions due
    ``gap`` seconds apart."""
    with bench_schema("scheduled") as schema, rig(schema, BENCH_RECORD_STARTS="1") as r:
        outbox = migrated_outbox(schema)
        client = redis.Redis.from_url(REDIS_URL)
        r.stack.callback(client.close)
        r.idle_outbox()
        first = datetime.now(UTC) + LEAD
        whens = [first + timedelta(seconds=i * gap) for i in range(n)]
        requests = [
            replace(noop_request(f"scheduled-{i}", f"lane-{i}", i), not_before=when)
            for i, when in enumerate(whens)
        ]
        with psycopg.connect(DATABASE_URL) as conn:
            actions = outbox.enqueue_many(conn, requests)
        due = {action.id: when.timestamp() for action, when in zip(actions, whens, strict=True)}
        wait = LEAD.total_seconds() + n * gap + 30
        wait_until(lambda: client.hlen(apps.STARTS_KEY) >= n, wait, "scheduled actions not started")
        starts = {int(k): float(v) for k, v in client.hgetall(apps.STARTS_KEY).items()}
    return [starts[i] - t for i, t in due.items()]
