"""``wal``: the write-ahead log PostgreSQL writes per action, phase by phase (docs/scaling.md).

WAL is what a primary ships to its replicas and archives, and what bounds its write throughput
before CPU does; its position (``pg_current_wal_insert_lsn()``) moves for the whole cluster, so this
scenario runs on a private server of its own (``benchmarks.chaos.servers``: nobody else's writes
counted) with ``full_page_writes`` on, as in production, and reads the records between a phase's
two positions back with ``pg_waldump --stats`` (records, and the bytes of full-page images).
Each phase starts right after a CHECKPOINT, so its first change to every page pays a full-page
image, as the first change after each checkpoint does in production: with checkpoints minutes
apart and a busy table, a page takes many actions' rows between two checkpoints, so the figures
here are near the steady state, not below it.

Phases, each over N no-op actions of a lane each (the sum is an action's whole life):

- ``wal-enqueue``: ``enqueue_many``, 100 actions a transaction;
- ``wal-run``: the in-process executor (claim, take, fence, finish: ``claim_and_run``);
- ``wal-e2e``: another N enqueued and run by a real claimer and worker pool over Redis (the
  claim's lease, the pushes, housekeeping), enqueue included;
- ``wal-prune``: retention deleting the 2N ended actions, what dropping a time partition would
  save (docs/scaling.md).

``ratio`` is a phase's WAL an action over ``wal-run``'s; p50/p99 are a phase's steps (a
transaction, a round, an action's enqueue -> DONE, a prune batch).

``actions_per_s`` is measured too but on a server with fsync off: read it as a ratio between the
phases, not as the server's throughput (the ``inprocess`` and ``e2e`` scenarios measure that).
"""

from __future__ import annotations

import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks.chaos.servers import PG_BIN, PrivatePostgres, missing_binaries
from benchmarks.common import (
    NOOP,
    Result,
    Scale,
    all_ended,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.inprocess import NoopAdapter, run_all
from benchmarks.rig import rig, wait_until
from outbox import Outbox, event_loop
from outbox.retention import prune

#: Actions an enqueueing transaction carries (as the e2e scenario's application).
PER_TX = 100


#: WAL the private server keeps past its checkpoints: more than a phase writes, so the
#: checkpoint that ends a phase never recycles the segment pg_waldump starts reading from.
WAL_KEEP = "4GB"


class WalPostgres(PrivatePostgres):
    """The private server with full-page writes on, as a production primary has them (the
    fault tests' server turns them off to start faster), keeping ``WAL_KEEP`` of WAL."""

    def argv(self) -> list[str]:
        argv = [
            arg.replace("full_page_writes=off", "full_page_writes=on") for arg in super().argv()
        ]
        return [*argv, "-c", f"wal_keep_size={WAL_KEEP}"]


@contextmanager
def private_server() -> Iterator[WalPostgres]:
    problem = missing_binaries()
    if problem is not None:
        raise RuntimeError(f"the wal scenario needs a private PostgreSQL: {problem}")
    with WalPostgres() as server:
        yield server


#: pg_waldump --stats's last line: records, record bytes [%], full-page image bytes [%], total.
TOTAL = re.compile(r"^Total\s+(\d+)\s+(\d+)\s+\[[^]]*\]\s+(\d+)", re.MULTILINE)


def measured(server: WalPostgres, work: Callable[[], None]) -> dict[str, float]:
    """The WAL ``work`` wrote (bytes between the positions before and after it; records and
    full-page image bytes as pg_waldump counts them) and its seconds, after a checkpoint."""
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute("CHECKPOINT")
        # The insert position, not pg_current_wal_lsn() (the write position): with commits
        # that do not wait for a flush, a small phase's records can still sit in the WAL
        # buffers when it ends, and the write position would not have moved.
        (start,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()  # type: ignore[misc]
        started = time.perf_counter()
        work()
        seconds = time.perf_counter() - started
        (end,) = conn.execute("SELECT pg_current_wal_insert_lsn()::text").fetchone()  # type: ignore[misc]
        conn.execute("CHECKPOINT")  # every record up to the end on disk, for pg_waldump
        (wal_bytes, *segments) = conn.execute(  # type: ignore[misc]
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn),"
            " pg_walfile_name(%s::pg_lsn), pg_walfile_name(%s::pg_lsn)",
            (end, start, start, end),
        ).fetchone()
    if wal_bytes == 0:
        # pg_waldump refuses an empty range.
        return {"bytes": 0.0, "records": 0.0, "fpi_bytes": 0.0, "s": seconds}
    waldump = [str(PG_BIN / "pg_waldump"), "-p", str(server.data / "pg_wal"), "--stats"]
    # The first and last segments named: without them pg_waldump learns the segment size from
    # whichever file of the directory it lists first, which may be one the server made ahead
    # and has not written yet (a header of zeros, "WAL segment size must be a power of two").
    dump = subprocess.run(
        [*waldump, "-s", start, "-e", end, *segments],
        capture_output=True,
        text=True,
        user=server.user,
    )
    if dump.returncode != 0:
        raise RuntimeError(f"pg_waldump {start}..{end} failed:\n{dump.stderr[-2000:]}")
    found = TOTAL.search(dump.stdout)
    if found is None:
        raise RuntimeError(f"pg_waldump --stats said nothing of use:\n{dump.stdout[-2000:]}")
    records, _record_bytes, fpi_bytes = (float(value) for value in found.groups())
    return {"bytes": float(wal_bytes), "records": records, "fpi_bytes": fpi_bytes, "s": seconds}


def enqueue(outbox: Outbox, url: str, keys: range, tag: str, steps: list[float]) -> None:
    """``keys`` as actions, ``PER_TX`` a transaction; each transaction's seconds in ``steps``."""
    with psycopg.connect(url) as conn:
        for start in range(keys.start, keys.stop, PER_TX):
            began = time.perf_counter()
            batch = range(start, min(keys.stop, start + PER_TX))
            outbox.enqueue_many(conn, [noop_request(f"{tag}-{i}", f"lane-{i}", i) for i in batch])
            conn.commit()
            steps.append(time.perf_counter() - began)


@dataclass
class Phase:
    """One phase's WAL, its actions, and the seconds of each of its steps (p50/p99)."""

    name: str
    n: int
    wal: dict[str, float]
    steps: list[float]
    what: str

    @property
    def bytes_per_action(self) -> float:
        return self.wal["bytes"] / self.n


def result(phase: Phase, reference: Phase) -> Result:
    """The row of ``phase``; ``ratio`` is its WAL an action over ``reference``'s."""
    return Result(
        scenario=f"wal-{phase.name}",
        n=phase.n,
        actions_per_s=round(phase.n / phase.wal["s"], 1),
        p50_ms=ms(percentile(phase.steps, 50)),
        p99_ms=ms(percentile(phase.steps, 99)),
        ratio=round(phase.bytes_per_action / reference.bytes_per_action, 3),
        ratio_to=f"wal-{reference.name} bytes/action",
        extra={
            "wal_bytes_per_action": round(phase.bytes_per_action),
            "wal_records_per_action": round(phase.wal["records"] / phase.n, 2),
            "full_page_image_bytes_per_action": round(phase.wal["fpi_bytes"] / phase.n),
            "what": phase.what,
            "server": "private, full_page_writes=on, fsync=off (rates are ratios only)",
        },
    )


def run(scale: Scale) -> list[Result]:
    n = scale.n(5_000, 20_000, floor=100)
    phases: list[Phase] = []
    with private_server() as server, bench_schema("wal", server.url) as schema:
        url = server.url
        outbox = migrated_outbox(schema, url)
        outbox.register(NOOP, NoopAdapter())

        steps: list[float] = []
        wal = measured(server, lambda: enqueue(outbox, url, range(n), "run", steps))
        what = f"enqueue_many, {PER_TX} a transaction; p50/p99: a transaction"
        phases.append(Phase("enqueue", n, wal, steps, what))

        rounds: list[float] = []

        def run_in_process() -> None:
            rounds.extend(event_loop.run(run_all(outbox, n), outbox.settings.event_loop)[2])

        wal = measured(server, run_in_process)
        what = "in-process claim, take, fence, finish; p50/p99: a claim_and_run round"
        phases.append(Phase("run", n, wal, rounds, what))

        with rig(schema, OUTBOX_DATABASE_URL=url) as r:
            r.outbox_workers()
            r.claimer()
            watch: Any = psycopg.connect(url, autocommit=True)
            with watch:

                def end_to_end() -> None:
                    enqueue(outbox, url, range(n, 2 * n), "e2e", [])
                    wait_until(lambda: all_ended(watch, schema), 600, "e2e", 0.05)

                wal = measured(server, end_to_end)
                in_system = [
                    row[0]
                    for row in watch.execute(
                        "SELECT extract(epoch FROM ended_at - created_at)::float8 FROM "
                        f'"{schema}".agent_action WHERE idempotency_key LIKE %s',
                        ("e2e-%",),
                    )
                ]
        what = "enqueue + claimer + worker pool over Redis, as deployed; p50/p99: enqueue -> DONE"
        phases.append(Phase("e2e", n, wal, in_system, what))

        batches: list[float] = []

        def prune_all() -> None:
            deleted = 0
            with psycopg.connect(url, autocommit=True) as conn:
                while deleted < 2 * n:
                    began = time.perf_counter()
                    pruned = prune(conn, timedelta(0), schema=schema, max_batches=1)
                    batches.append(time.perf_counter() - began)
                    if not pruned:
                        raise AssertionError(f"pruned {deleted} of {2 * n} ended actions")
                    deleted += pruned

        wal = measured(server, prune_all)
        what = "retention deleting ended actions; p50/p99: a batch"
        phases.append(Phase("prune", 2 * n, wal, batches, what))
    reference = phases[1]
    return [result(phase, reference) for phase in phases]
