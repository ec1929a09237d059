"""``enqueue``: actions/s of the real ``outbox.enqueue`` (sync psycopg, one client), one action a
transaction and 1,000 a transaction, and of ``outbox.enqueue_many`` with 1,000 a call and a
transaction. Each is compared with the same client inserting rows of the same shape into a plain
table (no triggers, no lane table, a unique key) the same way (one INSERT a row, or one
multi-row INSERT a transaction), the two taking turns (``TURNS``): the ratio is what the
outbox's bookkeeping costs on the application's write path. Then the first write on a new
connection (``enqueue_first``) and many clients at once (``enqueue_concurrent``).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks import enqueue_concurrent, enqueue_first
from benchmarks.common import (
    DATABASE_URL,
    NOOP,
    Result,
    Scale,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)

PLAIN = """
CREATE TABLE {s}.plain (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind text NOT NULL, workspace_id text, lane_key text NOT NULL,
    idempotency_key text NOT NULL UNIQUE, payload jsonb,
    created_at timestamptz NOT NULL DEFAULT now())
"""
INSERT_PLAIN = (
    "INSERT INTO {s}.plain (kind, workspace_id, lane_key, idempotency_key, payload)"
    " VALUES (%s, %s, %s, %s, %s)"
)
INSERT_PLAIN_MANY = (
    "INSERT INTO {s}.plain (kind, workspace_id, lane_key, idempotency_key, payload)"
    " SELECT %s, 'w', k, k, p FROM unnest(%s::text[], %s::jsonb[]) AS r(k, p)"
)
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
#: Actions a call (and a transaction) of the enqueue-many case.
MANY = 1_000


@dataclass
class Timed:
    """``n`` writes: wall seconds, each transaction's latency (its writes plus the commit), and
    the CPU seconds of this client and of its PostgreSQL backend (None where ``/proc`` is not
    readable, or the server is not on this machine)."""

    seconds: float
    latencies: list[float]
    client_cpu_s: float
    server_cpu_s: float | None

    def cpu_ms_per_action(self, n: int) -> dict[str, float | None]:
        server = None if self.server_cpu_s is None else round(self.server_cpu_s / n * 1000, 4)
        return {
            "client_cpu_ms_per_action": round(self.client_cpu_s / n * 1000, 4),
            "postgres_cpu_ms_per_action": server,
        }


def _backend_cpu(pid: int) -> float | None:
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = raw.rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


#: The two sides of a case take turns, each a tenth of the writes at a time (the side that goes
#: first alternating), so that both meet the same minutes of a shared machine: timed one after
#: the other, a slow patch landing on one side moved `enqueue-single` from 0.48 to 0.73 between
#: runs of the same code.
TURNS = 10


def _timed_in_turns(n: int, per_tx: int, writes: dict[str, Any]) -> dict[str, Timed]:
    """``n`` writes by each of ``writes`` (name -> ``write(conn, i)``), committed ``per_tx`` at a
    time, each side on its own connection; the sides take turns of about ``n / TURNS`` writes
    (whole transactions), and each side's time, latencies and CPU add up over its turns."""
    chunk = max(per_tx, -(-n // TURNS // per_tx) * per_tx)
    with contextlib.ExitStack() as stack:
        sides = {
            name: _Side(stack.enter_context(psycopg.connect(DATABASE_URL)), write)
            for name, write in writes.items()
        }
        order = list(sides.values())
        for turn, first in enumerate(range(0, n, chunk)):
            for side in order if turn % 2 == 0 else reversed(order):
                side.run(range(first, min(n, first + chunk)), per_tx)
        return {name: side.timed() for name, side in sides.items()}


class _Side:
    """One side of a case: its connection and write, and what its turns added up to."""

    def __init__(self, conn: psycopg.Connection[Any], write: Any) -> None:
        self.conn = conn
        self.write = write
        self.backend = conn.info.backend_pid
        self.seconds = 0.0
        self.client = 0.0
        self.server: float | None = 0.0
        self.latencies: list[float] = []

    def run(self, writes: range, per_tx: int) -> None:
        server_started = _backend_cpu(self.backend)
        cpu_started = time.process_time()
        started = time.perf_counter()
        tx_started = started
        for i in writes:
            self.write(self.conn, i)
            if i % per_tx == per_tx - 1 or i == writes[-1]:
                self.conn.commit()
                now = time.perf_counter()
                self.latencies.append(now - tx_started)
                tx_started = now
        self.seconds += time.perf_counter() - started
        self.client += time.process_time() - cpu_started
        server_ended = _backend_cpu(self.backend)
        if self.server is None or server_started is None or server_ended is None:
            self.server = None
        else:
            self.server += server_ended - server_started

    def timed(self) -> Timed:
        return Timed(self.seconds, self.latencies, self.client, self.server)


def run(scale: Scale) -> list[Result]:
    results: list[Result] = []
    with bench_schema("enqueue") as schema:
        outbox = migrated_outbox(schema)
        s = f'"{schema}"'
        with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
            conn.execute(PLAIN.format(s=s))
        insert_plain = INSERT_PLAIN.format(s=s)
        cases = (
            ("enqueue-single", 1, scale.n(1_000, 5_000, floor=20)),
            ("enqueue-batch", 1_000, scale.n(20_000, 100_000, floor=50)),
        )
        for name, per_tx, n in cases:
            tag = name.removeprefix("enqueue-")

            def outbox_write(conn: psycopg.Connection[Any], i: int, tag: str = tag) -> None:
                outbox.enqueue(
                    conn,
                    noop_request(f"{tag}-{i}", i=i),
                )

            def plain_write(conn: psycopg.Connection[Any], i: int, tag: str = tag) -> None:
                conn.execute(
                    insert_plain, (NOOP.name, "w", f"{tag}-{i}", f"{tag}-{i}", Jsonb({"i": i}))
                )

            timed = _timed_in_turns(n, per_tx, {"plain": plain_write, "outbox": outbox_write})
            results.append(_result(name, n, per_tx, timed["outbox"], timed["plain"]))

        n = scale.n(20_000, 100_000, floor=50)
        insert_plain_many = INSERT_PLAIN_MANY.format(s=s)

        def plain_many(conn: psycopg.Connection[Any], i: int) -> None:
            if i % MANY == 0:
                keys = [f"many-{j}" for j in range(i, min(n, i + MANY))]
                payloads = [Jsonb({"i": j}) for j in range(i, min(n, i + MANY))]
                conn.execute(insert_plain_many, (NOOP.name, keys, payloads))

        def outbox_many(conn: psycopg.Connection[Any], i: int) -> None:
            if i % MANY == 0:
                outbox.enqueue_many(
                    conn, [noop_request(f"many-{j}", i=j) for j in range(i, min(n, i + MANY))]
                )

        timed = _timed_in_turns(n, MANY, {"plain": plain_many, "outbox": outbox_many})
        results.append(_result("enqueue-many", n, MANY, timed["outbox"], timed["plain"]))
        results.append(enqueue_first.run(scale, schema, insert_plain))
        results.append(enqueue_concurrent.run(scale, schema, insert_plain))
    return results


def _result(name: str, n: int, per_tx: int, outbox_run: Timed, plain: Timed) -> Result:
    many = name == "enqueue-many"
    rate = n / outbox_run.seconds
    ceiling = n / plain.seconds
    plain_cpu = plain.cpu_ms_per_action(n)
    return Result(
        scenario=name,
        n=n,
        actions_per_s=round(rate, 1),
        p50_ms=ms(percentile(outbox_run.latencies, 50)),
        p99_ms=ms(percentile(outbox_run.latencies, 99)),
        ratio=round(rate / ceiling, 3),
        ratio_to="plain-insert-many" if many else f"plain-insert-{name.removeprefix('enqueue-')}",
        extra={
            "per_transaction": per_tx,
            "ceiling_per_s": round(ceiling, 1),
            "latency_is": "one transaction (its enqueues and commit)",
            **outbox_run.cpu_ms_per_action(n),
            **{f"ceiling_{key}": value for key, value in plain_cpu.items()},
        },
    )
