"""``broker-restart``: the Redis broker restarts without persistence (every queued message and
every consumer's unacknowledged set lost, ``DOWNTIME`` seconds down) while the pool works through
a backlog; how much longer did the backlog take, and did any action wait for its lease?

A real claimer and worker pool (the common layout) on a Redis of the scenario's own (a temp dir
and a free port, as the fault tests use: the shared Redis is never restarted), with a 30-s lease.
``N`` actions are enqueued at once; each provider call takes ``PROVIDER_SECONDS`` after its
fence, and the claimer's in-flight bound is four times what the pool's threads hold, so most
claims wait in the broker as messages (as for a claimer feeding several pools, or a pool scaled
down). The same backlog is drained twice in one schema: once undisturbed (the baseline), once
with the broker restarted a quarter into the drain (``RESTART_AT`` of the baseline's time).

Reported: ``baseline_ms`` and ``drain_ms`` (first action enqueued -> last ended), ``lost``
(actions pushed before the restart that no worker had taken when it began: the messages the
restart dropped), ``resume_ms`` (broker back -> the first end after it), ``recovered_ms``
(broker back -> the last of the lost ones ended), ``left_to_lease`` (lost ones that ended more
than half a lease after the broker was back: they waited to be reclaimed), ``not_done``;
p50/p99 are enqueue -> end in the drain with the restart. ``ratio`` is ``drain_ms`` over
``baseline_ms``: a restart that cost only its downtime adds that to the drain, no more.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

from benchmarks.chaos.servers import PrivateRedis, missing_binaries
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
from benchmarks.restarts import Caught
from benchmarks.rig import ACTIONS_PER_MESSAGE, PROCESSES, THREADS, rig

#: Seconds each provider call takes after its fence.
PROVIDER_SECONDS = 0.5
#: Seconds the broker stays down, and how far into the drain it goes down (a fraction of the
#: undisturbed drain's time, so that the drain is under way at every scale).
DOWNTIME = 2.0
RESTART_AT = 0.25
LEASE = 30.0
#: Claims in flight: four times what the pool's threads hold, the rest queued in the broker.
IN_FLIGHT = 4 * PROCESSES * THREADS * ACTIONS_PER_MESSAGE
WRITE_MARGIN = 5.0


def run(scale: Scale) -> list[Result]:
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"broker-restart needs a Redis of its own: {missing}")
    n = scale.n(6_000, 12_000, floor=50)
    with PrivateRedis() as server, bench_schema("broker_restart") as schema:
        outbox = migrated_outbox(schema)
        settings = {
            "OUTBOX_BROKER_URL": server.url,
            "OUTBOX_IN_FLIGHT": str(IN_FLIGHT),
            "OUTBOX_LEASE_SECONDS": str(LEASE),
            "OUTBOX_WRITE_MARGIN_SECONDS": str(WRITE_MARGIN),
            "BENCH_PROVIDER_SECONDS": str(PROVIDER_SECONDS),
        }
        with rig(schema, **settings) as r:
            r.idle_outbox()
            baseline = _drain(outbox, schema, n, "baseline")
            # From this thread: a private server dies with the thread that started it.
            started = _enqueue(outbox, n, "restart")
            time.sleep(RESTART_AT * baseline)
            down = time.time()
            pending = _pushed_not_taken(schema)
            server.restart(downtime=DOWNTIME)
            back = time.time()
            rows = _wait_all_ended(schema, started[-1], since=started[0])
    return [_result(n, baseline, rows, pending, down, back)]


def _enqueue(outbox: Any, n: int, tag: str) -> list[int]:
    """The ids of ``n`` actions enqueued in one transaction, each on a lane of its own."""
    with psycopg.connect(DATABASE_URL) as conn:
        actions = outbox.enqueue_many(conn, [noop_request(f"{tag}-{i}", i=i) for i in range(n)])
        conn.commit()
    return [action.id for action in actions]


def _drain(outbox: Any, schema: str, n: int, tag: str) -> float:
    """Seconds from enqueueing ``n`` actions to the last one's end."""
    ids = _enqueue(outbox, n, tag)
    rows = _wait_all_ended(schema, ids[-1], since=ids[0])
    return max(row[2] for row in rows) - min(row[3] for row in rows)


def _pushed_not_taken(schema: str) -> set[int]:
    """Actions claimed and pushed whose message no worker has taken yet."""
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        rows = conn.execute(
            f"SELECT id FROM {schema}.agent_action"
            " WHERE state = 'EXECUTING' AND taken_epoch IS DISTINCT FROM epoch"
        ).fetchall()
    return {row[0] for row in rows}


def _wait_all_ended(schema: str, last: int, since: int = 0) -> list[tuple[Any, ...]]:
    """Id, state, end and creation (epoch seconds) of the actions ``since``..``last``, once
    every one of them has ended."""
    deadline = time.monotonic() + 3 * LEASE + 60
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                f"SELECT id, state, extract(epoch FROM ended_at)::float8,"
                f" extract(epoch FROM created_at)::float8 FROM {schema}.agent_action"
                " WHERE id BETWEEN %s AND %s",
                (since, last),
            ).fetchall()
            if rows and all(row[2] is not None for row in rows):
                return rows
            if time.monotonic() > deadline:
                left = sum(1 for row in rows if row[2] is None)
                raise TimeoutError(f"broker-restart: {left} actions had not ended")
            time.sleep(0.1)


def _result(
    n: int,
    baseline: float,
    rows: list[tuple[Any, ...]],
    pending: set[int],
    down: float,
    back: float,
) -> Result:
    ended = {row[0]: row[2] for row in rows}
    latencies = [row[2] - row[3] for row in rows]
    drain = max(ended.values()) - min(row[3] for row in rows)
    lost = [i for i in pending if ended[i] > down]
    caught = Caught.of(ended, lost, back, LEASE)
    return Result(
        scenario="broker-restart",
        n=n,
        actions_per_s=round(n / drain, 1),
        p50_ms=ms(percentile(latencies, 50)),
        p99_ms=ms(percentile(latencies, 99)),
        ratio=round(drain / baseline, 3),
        ratio_to="undisturbed drain",
        extra={
            "baseline_ms": ms(baseline),
            "drain_ms": ms(drain),
            "downtime_ms": ms(back - down),
            "lease_s": LEASE,
            "provider_call_s": PROVIDER_SECONDS,
            "lost": len(lost),
            **caught.report(),
            "not_done": sum(1 for row in rows if row[1] != "DONE"),
            "latency_is": "enqueue commit -> end, the drain with the restart",
        },
    )
