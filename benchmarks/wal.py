"""``wal``: the write-ahead log PostgreSQL writes per action, phase by phase (docs/scaling.md).

WAL is what a primary ships to its replicas and archives, and what bounds its write throughput
before CPU does; its position (``pg_current_wal_lsn()``) moves for the whole cluster, so this
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

``actions_per_s`` is measured too but on a server with fsync off: read it as a ratio between the
phases, not as the server's throughput (the ``inprocess`` and ``e2e`` scenarios measure that).
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks.chaos.servers import PG_BIN, PrivatePostgres, missing_binaries
from benchmarks.common import (
    NOOP,
    Result,
    Scale,
    bench_schema,
    ended_count,
    migrated_outbox,
    noop_request,
)
from benchmarks.inprocess import NoopAdapter, run_all
from benchmarks.rig import rig, wait_until
from outbox import Outbox
from outbox.retention import prune

#: Actions an enqueueing transaction carries (as the e2e scenario's application).
PER_TX = 100


class WalPostgres(PrivatePostgres):
    """The private server with full-page writes on, as a production primary has them (the
    fault tests' server turns them off to start faster)."""

    def argv(self) -> list[str]:
        return [
            arg.replace("full_page_writes=off", "full_page_writes=on") for arg in super().argv()
        ]


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
        (start,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()  # type: ignore[misc]
        started = time.perf_counter()
        work()
        seconds = time.perf_counter() - started
        (end,) = conn.execute("SELECT pg_current_wal_lsn()::text").fetchone()  # type: ignore[misc]
        (wal_bytes,) = conn.execute(  # type: ignore[misc]
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", (end, start)
        ).fetchone()
    waldump = [str(PG_BIN / "pg_waldump"), "-p", str(server.data / "pg_wal"), "--stats"]
    dump = subprocess.run(
        [*waldump, "-s", start, "-e", end],
        capture_output=True,
        text=True,
        user=server.user,
        check=True,
    )
    found = TOTAL.search(dump.stdout)
    if found is None:
        raise RuntimeError(f"pg_waldump --stats said nothing of use:\n{dump.stdout[-2000:]}")
    records, _record_bytes, fpi_bytes = (float(value) for value in found.groups())
    return {"bytes": float(wal_bytes), "records": records, "fpi_bytes": fpi_bytes, "s": seconds}


def enqueue(outbox: Outbox, url: str, keys: range, tag: str) -> None:
    with psycopg.connect(url) as conn:
        for start in range(keys.start, keys.stop, PER_TX):
            batch = range(start, min(keys.stop, start + PER_TX))
            outbox.enqueue_many(conn, [noop_request(f"{tag}-{i}", f"lane-{i}", i) for i in batch])
            conn.commit()


def result(phase: str, n: int, wal: dict[str, float], note: str) -> Result:
    return Result(
        scenario=f"wal-{phase}",
        n=n,
        actions_per_s=round(n / wal["s"], 1),
        p50_ms=None,
        p99_ms=None,
        extra={
            "wal_bytes_per_action": round(wal["bytes"] / n),
            "wal_records_per_action": round(wal["records"] / n, 2),
            "full_page_image_bytes_per_action": round(wal["fpi_bytes"] / n),
            "what": note,
            "server": "private, full_page_writes=on, fsync=off (rates are ratios only)",
        },
    )


def run(scale: Scale) -> list[Result]:
    n = scale.n(5_000, 20_000, floor=100)
    results = []
    with private_server() as server, bench_schema("wal", server.url) as schema:
        url = server.url
        outbox = migrated_outbox(schema, url)
        adapter = NoopAdapter()
        outbox.register(NOOP, adapter)

        wal = measured(server, lambda: enqueue(outbox, url, range(n), "run"))
        results.append(result("enqueue", n, wal, f"enqueue_many, {PER_TX} a transaction"))

        def run_in_process() -> None:
            asyncio.run(run_all(outbox, n))

        wal = measured(server, run_in_process)
        results.append(result("run", n, wal, "in-process claim, take, fence, finish"))

        with rig(schema, OUTBOX_DATABASE_URL=url) as r:
            r.outbox_workers()
            r.claimer()
            watch: Any = psycopg.connect(url, autocommit=True)
            with watch:

                def end_to_end() -> None:
                    enqueue(outbox, url, range(n, 2 * n), "e2e")
                    wait_until(lambda: ended_count(watch, schema) >= 2 * n, 600, "e2e", 0.05)

                wal = measured(server, end_to_end)
        results.append(
            result("e2e", n, wal, "enqueue + claimer + worker pool over Redis, as deployed")
        )

        def prune_all() -> None:
            with psycopg.connect(url, autocommit=True) as conn:
                deleted = prune(conn, timedelta(0), schema=schema)
            if deleted != 2 * n:
                raise AssertionError(f"pruned {deleted} of {2 * n} ended actions")

        wal = measured(server, prune_all)
        results.append(result("prune", 2 * n, wal, "retention deleting ended actions"))
    return results
