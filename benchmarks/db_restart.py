"""``db-restart``: PostgreSQL restarts (every connection broken, ``DOWNTIME`` seconds down) under a
steady load; how long until every action it caught has ended, and did any wait for its lease?

A real claimer and worker pool (the common layout) run on a PostgreSQL of the scenario's own (a
temp dir and a free port, as the fault tests use: the shared server is never restarted), with a
30-s lease. One enqueuer offers ``RATE`` actions/s, one a transaction; each action's provider
call takes ``PROVIDER_SECONDS`` after its fence, so that attempts are in flight, past their
fence, when the server goes down. The enqueuer's own transactions fail while the server is down:
it reconnects, drops the requests whose time passed meanwhile (``enqueues_dropped``; an
application would retry them), and goes on.

Reported, from the database once every action ended, against the moment the server answered
again: ``caught`` (actions enqueued before the restart that had not ended when it began),
``resume_ms`` (the first action that ended after it), ``recovered_ms`` (the last of the caught
ones), ``left_to_lease`` (caught actions that ended more than half a lease after it: their
attempt's result was lost and they waited to be reclaimed), ``not_done`` (ended otherwise than
DONE); p50/p99 are enqueue commit -> end of every action. ``ratio`` is ``recovered_ms`` over the
downtime.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

import psycopg

from benchmarks.chaos.servers import PrivatePostgres, missing_binaries
from benchmarks.common import Result, Scale, migrated_outbox, ms, noop_request, percentile
from benchmarks.restarts import Caught
from benchmarks.rig import rig
from outbox import enqueue

SCHEMA = "bench_db_restart"
#: Offered actions a second, one a transaction.
RATE = 100.0
#: Seconds each provider call takes after its fence.
PROVIDER_SECONDS = 0.2
#: Seconds the server stays down.
DOWNTIME = 2.0
LEASE = 30.0
WRITE_MARGIN = 5.0
#: Seconds of load before the restart and after the server is back.
BEFORE = {True: 4.0, False: 10.0}
AFTER = {True: 6.0, False: 20.0}
#: A request whose time passed by this much while the enqueuer was cut off is dropped.
LATE = 0.5


@dataclass
class Enqueuer:
    """Offers ``RATE`` actions/s to ``url`` until stopped; what it committed, by action id."""

    url: str
    committed: dict[int, float] = field(default_factory=dict)
    failed: int = 0
    dropped: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        started = time.perf_counter()
        conn: psycopg.Connection[Any] | None = None
        i = 0
        while not self.stop.is_set():
            due = started + i / RATE
            i += 1
            wait = due - time.perf_counter()
            if wait < -LATE:
                self.dropped += 1
                continue
            if wait > 0:
                time.sleep(wait)
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self.url, connect_timeout=1)
                action = enqueue(conn, noop_request(f"restart-{i}"), schema=SCHEMA)
                conn.commit()
                self.committed[action.id] = time.time()
            except psycopg.OperationalError:
                self.failed += 1
                if conn is not None:
                    conn.close()
                conn = None
                time.sleep(0.05)
        if conn is not None:
            conn.close()


def run(scale: Scale) -> list[Result]:
    missing = missing_binaries()
    if missing:
        raise RuntimeError(f"db-restart needs a PostgreSQL of its own: {missing}")
    before = scale.seconds(quick=BEFORE[True], full=BEFORE[False])
    after = scale.seconds(quick=AFTER[True], full=AFTER[False])
    with PrivatePostgres() as server:
        migrated_outbox(SCHEMA, server.url)
        settings = {
            "OUTBOX_DATABASE_URL": server.url,
            "OUTBOX_LEASE_SECONDS": str(LEASE),
            "OUTBOX_WRITE_MARGIN_SECONDS": str(WRITE_MARGIN),
            "BENCH_PROVIDER_SECONDS": str(PROVIDER_SECONDS),
        }
        with rig(SCHEMA, **settings) as r:
            r.idle_outbox()
            enqueuer = Enqueuer(server.url)
            thread = threading.Thread(target=enqueuer.run, name="enqueuer", daemon=True)
            thread.start()
            time.sleep(before)
            # From this thread: a private server dies with the thread that started it.
            down = time.time()
            server.restart(downtime=DOWNTIME)
            back = time.time()
            time.sleep(after)
            enqueuer.stop.set()
            thread.join(10)
            rows = _wait_all_ended(server.url, len(enqueuer.committed))
    return [_result(enqueuer, rows, down, back)]


def _wait_all_ended(url: str, n: int) -> list[tuple[Any, ...]]:
    """Every action's id, state and end (epoch seconds), once all ``n`` have ended."""
    deadline = time.monotonic() + 2 * LEASE + 60
    with psycopg.connect(url, autocommit=True) as conn:
        while True:
            rows = conn.execute(
                f"SELECT id, state, extract(epoch FROM ended_at)::float8 FROM {SCHEMA}.agent_action"
            ).fetchall()
            if len(rows) >= n and all(row[2] is not None for row in rows):
                return rows
            if time.monotonic() > deadline:
                left = sum(1 for row in rows if row[2] is None)
                raise TimeoutError(f"db-restart: {left} actions had not ended")
            time.sleep(0.2)


def _result(enqueuer: Enqueuer, rows: list[tuple[Any, ...]], down: float, back: float) -> Result:
    committed = enqueuer.committed
    ended = {row[0]: row[2] for row in rows}
    caught = [i for i, at in committed.items() if at < down and ended[i] > down]
    outcome = Caught.of(ended, caught, back, LEASE)
    latencies = [ended[i] - at for i, at in committed.items()]
    return Result(
        scenario="db-restart",
        n=len(committed),
        actions_per_s=RATE,
        p50_ms=ms(percentile(latencies, 50)),
        p99_ms=ms(percentile(latencies, 99)),
        ratio=round(outcome.recovered / DOWNTIME, 3),
        ratio_to="downtime",
        extra={
            "downtime_ms": ms(back - down),
            "lease_s": LEASE,
            "provider_call_s": PROVIDER_SECONDS,
            "caught": len(caught),
            **outcome.report(),
            "not_done": sum(1 for row in rows if row[1] != "DONE"),
            "enqueues_failed": enqueuer.failed,
            "enqueues_dropped": enqueuer.dropped,
            "latency_is": "enqueue commit -> end (DONE or otherwise)",
        },
    )
