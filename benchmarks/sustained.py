"""``sustained``: a steady load for minutes with a short retention, so that the claimer prunes
while it claims: do latency and the table's size hold over time?

An enqueuer offers ``RATE`` actions/s (``enqueue_many``, ``PER_TX`` a transaction, paced) to the
common pool (a claimer and the workers of ``benchmarks.rig``) for the run's duration, with
``OUTBOX_RETENTION_SECONDS`` = ``RETENTION``: an action is deleted about ``RETENTION`` seconds
after it ended, by the claimer's housekeeping (every ``OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS``,
the default 5). The rate is above what one bound a housekeeping interval prunes (5,000 actions
every 5 s) and below what the pool runs. A server without autovacuum gets its vacuum from the
scenario (``VACUUM_EVERY``), so that the table's size measures the outbox.

Reported: p50/p99 of enqueue -> DONE (database clock) over the whole run and per window (a
tenth of the run), read every ``PROBE`` of the retention from the actions that ended since the
last read (before retention deletes them); the rows and the size of ``agent_action`` at each
window's end; and ``ratio``, the actions pruned over the actions enqueued in the second half of
the run (1.0: retention keeps up and the table stays flat; below 1.0 the table grows by the
difference). A run long enough to reach the steady state fails if the table holds more than
twice what retention should leave.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

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
from benchmarks.cpu import CpuMeter
from benchmarks.rig import IN_FLIGHT, paced, rig

#: Offered actions/s: above one retention bound an interval (1,000/s), below the pool's rate.
RATE = 1_200
#: Actions an enqueueing transaction.
PER_TX = 20
#: Seconds an ended action is kept (the default is 30 days; short here so pruning runs).
RETENTION = 20
#: The claimer's housekeeping interval: the default.
HOUSEKEEPING = 5
#: Windows a run is cut into for the per-window figures.
WINDOWS = 10
#: The latencies are read this often, as a share of the retention (well before the prune).
PROBE = 0.25
#: A finish whose transaction began this long ago has committed: a read takes the actions ended
#: up to then, so that none is read before it is visible and then never.
SETTLED = 1.0
#: Seconds the actions still waiting when the load stops may take to end.
DRAIN_TIMEOUT = 300
#: Where the server runs without autovacuum (this machine's CI server does), the scenario
#: vacuums the outbox's tables itself this often, as an autovacuum tuned for a queue table
#: would; otherwise the table's size measures the missing vacuum, not the outbox.
VACUUM_EVERY = 15.0


@dataclass(frozen=True)
class Sample:
    """The action table at one moment: seconds since the load started, actions enqueued so far,
    rows, total bytes (indexes and TOAST included)."""

    at: float
    enqueued: int
    rows: int
    bytes: int


def _sample(watch: psycopg.Connection[Any], schema: str, at: float, enqueued: int) -> Sample:
    row = watch.execute(
        f"""SELECT count(*), pg_total_relation_size('"{schema}".agent_action')
              FROM "{schema}".agent_action"""
    ).fetchone()
    assert row is not None
    return Sample(round(at, 2), enqueued, row[0], row[1])


class Latencies:
    """Enqueue -> DONE of every action that ended, read in turns before retention deletes it:
    each read takes the actions ended after the last read's bound, up to ``SETTLED`` ago."""

    def __init__(self, watch: psycopg.Connection[Any], schema: str) -> None:
        self.watch = watch
        self.schema = schema
        self.since: datetime | None = None
        #: (seconds since the load started when read, that read's latencies)
        self.reads: list[tuple[float, list[float]]] = []

    def read(self, at: float) -> None:
        rows = self.watch.execute(
            f"""WITH bound AS (SELECT now() - make_interval(secs => %(settled)s) AS until)
                SELECT b.until,
                       array_agg(extract(epoch FROM a.ended_at - a.created_at)::float8)
                           FILTER (WHERE a.id IS NOT NULL)
                  FROM bound b
                  LEFT JOIN "{self.schema}".agent_action a
                    ON a.ended_at > coalesce(%(since)s::timestamptz, '-infinity')
                       AND a.ended_at <= b.until AND a.state = 'DONE'
                 GROUP BY b.until""",
            {"settled": SETTLED, "since": self.since},
        ).fetchone()
        assert rows is not None
        self.since, latencies = rows[0], rows[1] or []
        self.reads.append((at, latencies))

    def count(self) -> int:
        return sum(len(values) for _, values in self.reads)


@contextmanager
def vacuumed(schema: str, every: float) -> Iterator[dict[str, Any]]:
    """Vacuums (and analyzes) every table of ``schema`` each ``every`` seconds in a thread of
    its own while the block runs, if the server's autovacuum is off; yields what it did."""
    done: dict[str, Any] = {"by": "autovacuum", "vacuums": 0, "vacuum_s": 0.0}
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        row = conn.execute("SHOW autovacuum").fetchone()
        if row and row[0] == "on":
            yield done
            return
        done["by"] = f"the scenario, every {every:g} s (autovacuum is off)"
        stop = threading.Event()

        def vacuum() -> None:
            while not stop.wait(every):
                tables = conn.execute(
                    "SELECT string_agg(format('%%I.%%I', schemaname, tablename), ', ')"
                    " FROM pg_tables WHERE schemaname = %s",
                    [schema],
                ).fetchone()
                started = time.perf_counter()
                conn.execute(f"VACUUM (ANALYZE) {tables[0] if tables else ''}")
                done["vacuums"] += 1
                done["vacuum_s"] += time.perf_counter() - started

        thread = threading.Thread(target=vacuum, name="sustained-vacuum", daemon=True)
        thread.start()
        try:
            yield done
        finally:
            stop.set()
            thread.join()


def run(scale: Scale) -> list[Result]:
    full = scale.factor >= 1
    rate = max(50, int(RATE * min(1.0, scale.factor)))
    duration = max(6.0, scale.seconds(quick=60, full=300))
    # A tiny run keeps its actions longer than a read takes to reach them (SETTLED + PROBE).
    retention = RETENTION if full else 3
    housekeeping = HOUSEKEEPING if full else 1
    settings = {
        "OUTBOX_RETENTION_SECONDS": str(retention),
        "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": str(housekeeping),
    }
    samples: list[Sample] = []
    with bench_schema("sustained") as schema, rig(schema, **settings) as r:
        outbox = migrated_outbox(schema)
        cpu = CpuMeter(enqueuer=os.getpid(), **r.idle_outbox())
        window = duration / WINDOWS
        probe = retention * PROBE
        with (
            vacuumed(schema, VACUUM_EVERY if full else 1.0) as vacuum,
            psycopg.connect(DATABASE_URL) as conn,
            psycopg.connect(DATABASE_URL, autocommit=True) as watch,
        ):
            latencies = Latencies(watch, schema)
            cpu.start()
            started = time.perf_counter()
            next_sample, next_probe, enqueued = window, probe, 0
            for tick in paced(int(duration * rate / PER_TX), rate / PER_TX):
                first = tick * PER_TX
                requests = [
                    noop_request(f"sustained-{i}", f"lane-{i}", i)
                    for i in range(first, first + PER_TX)
                ]
                outbox.enqueue_many(conn, requests)
                conn.commit()
                enqueued += PER_TX
                at = time.perf_counter() - started
                if at >= next_probe:
                    latencies.read(at)
                    next_probe += probe
                if at >= next_sample and len(samples) < WINDOWS - 1:
                    samples.append(_sample(watch, schema, at, enqueued))
                    next_sample += window
            # The last window ends with the load.
            samples.append(_sample(watch, schema, time.perf_counter() - started, enqueued))
            # The rest ends; the reads go on, or retention would delete what they have not read.
            deadline = time.monotonic() + DRAIN_TIMEOUT
            while not all_ended(watch, schema):
                if time.monotonic() > deadline:
                    raise TimeoutError(f"sustained: actions not ended after {DRAIN_TIMEOUT}s")
                at = time.perf_counter() - started
                if at >= next_probe:
                    latencies.read(at)
                    next_probe += probe
                time.sleep(0.05)
            done_at = time.perf_counter()
            cpu.stop()
            time.sleep(SETTLED)
            latencies.read(time.perf_counter() - started)
            drained = _sample(watch, schema, time.perf_counter() - started, enqueued)
    if latencies.count() != enqueued:
        raise AssertionError(f"sustained: {latencies.count()} of {enqueued} actions read DONE")
    _check(samples, rate, retention, housekeeping, duration)
    result = _result(latencies, samples, done_at - started, rate, retention, housekeeping, duration)
    result.extra["rows_after_drain"] = drained.rows
    result.extra["vacuum_by"] = vacuum["by"]
    result.extra["vacuums"] = vacuum["vacuums"]
    result.extra["vacuum_s"] = round(vacuum["vacuum_s"], 1)
    # From the load's start to the last action's end; PostgreSQL's share includes the
    # scenario's VACUUM where the server's autovacuum is off (work autovacuum does otherwise).
    result.extra.update(cpu.per_action_ms(enqueued))
    return [result]


def _check(
    samples: list[Sample], rate: int, retention: float, housekeeping: float, duration: float
) -> None:
    """At the load's end, past the steady state, the table holds about ``rate`` x (retention
    + up to one housekeeping interval) ended actions, plus those in flight: more than twice
    that is retention falling behind."""
    if duration < 4 * (retention + housekeeping):
        return
    most = 2 * rate * (retention + 2 * housekeeping) + IN_FLIGHT
    if samples[-1].rows > most:
        raise AssertionError(
            f"sustained: {samples[-1].rows} rows after {duration:.0f} s at {rate}/s with "
            f"{retention} s retention (at most {most} expected): retention fell behind"
        )


def _result(
    latencies: Latencies,
    samples: list[Sample],
    took: float,
    rate: int,
    retention: float,
    housekeeping: float,
    duration: float,
) -> Result:
    window = duration / WINDOWS
    by_window: list[list[float]] = [[] for _ in range(WINDOWS)]
    for at, values in latencies.reads:
        by_window[min(WINDOWS - 1, int(at / window))].extend(values)
    # Second half: from the sample nearest the middle of the load to its end.
    middle = min(samples, key=lambda s: abs(s.at - duration / 2))
    last = samples[-1]
    enqueued = last.enqueued - middle.enqueued
    pruned = enqueued - (last.rows - middle.rows)
    values = [v for _, read in latencies.reads for v in read]
    return Result(
        scenario="sustained",
        n=len(values),
        actions_per_s=round(len(values) / took, 1),
        p50_ms=ms(percentile(values, 50)),
        p99_ms=ms(percentile(values, 99)),
        ratio=round(pruned / enqueued, 3) if enqueued > 0 else None,
        ratio_to="enqueued-second-half",
        extra={
            "offered_per_s": rate,
            "duration_s": round(duration, 1),
            "retention_s": retention,
            "housekeeping_s": housekeeping,
            "window_p50_ms": [ms(percentile(w, 50)) for w in by_window if w],
            "window_p99_ms": [ms(percentile(w, 99)) for w in by_window if w],
            "sample_at_s": [s.at for s in samples],
            "rows": [s.rows for s in samples],
            "table_mb": [round(s.bytes / 2**20, 1) for s in samples],
            "pruned_per_s_second_half": round(pruned / max(1e-9, last.at - middle.at), 1),
            "latency_is": "enqueue transaction start -> DONE, database clock, under the load",
        },
    )
