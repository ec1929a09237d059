"""``enqueue``: actions/s of the real ``outbox.enqueue`` (sync psycopg, one client), one action a
transaction and 1,000 a transaction. Each is compared with the same client inserting rows of the
same shape into a plain table (no triggers, no lane table, a unique key), measured in the same
run: the ratio is what the outbox's bookkeeping costs on the application's write path.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

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


def _timed(n: int, per_tx: int, write: Any) -> tuple[float, list[float]]:
    """Wall seconds for ``n`` writes committed ``per_tx`` at a time, and each commit's latency
    (the writes of its transaction plus the commit)."""
    latencies: list[float] = []
    with psycopg.connect(DATABASE_URL) as conn:
        started = time.perf_counter()
        tx_started = started
        for i in range(n):
            write(conn, i)
            if i % per_tx == per_tx - 1 or i == n - 1:
                conn.commit()
                now = time.perf_counter()
                latencies.append(now - tx_started)
                tx_started = now
        return time.perf_counter() - started, latencies


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

            plain_s, _ = _timed(n, per_tx, plain_write)
            outbox_s, latencies = _timed(n, per_tx, outbox_write)
            rate, ceiling = n / outbox_s, n / plain_s
            results.append(
                Result(
                    scenario=name,
                    n=n,
                    actions_per_s=round(rate, 1),
                    p50_ms=ms(percentile(latencies, 50)),
                    p99_ms=ms(percentile(latencies, 99)),
                    ratio=round(rate / ceiling, 3),
                    ratio_to=f"plain-insert-{tag}",
                    extra={
                        "per_transaction": per_tx,
                        "ceiling_per_s": round(ceiling, 1),
                        "latency_is": "one transaction (its enqueues and commit)",
                    },
                )
            )
    return results
