"""``enqueue``: actions/s of the real ``outbox.enqueue`` (sync psycopg, one client), one action a
transaction and 1,000 a transaction, and of ``outbox.enqueue_many`` with 1,000 a call and a
transaction. Each is compared with the same client inserting rows of the same shape into a plain
table (no triggers, no lane table, a unique key) the same way (one INSERT a row, or one
multi-row INSERT a transaction), measured in the same run: the ratio is what the outbox's
bookkeeping costs on the application's write path.
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
INSERT_PLAIN_MANY = (
    "INSERT INTO {s}.plain (kind, workspace_id, lane_key, idempotency_key, payload)"
    " SELECT %s, 'w', k, k, p FROM unnest(%s::text[], %s::jsonb[]) AS r(k, p)"
)
#: Actions a call (and a transaction) of the enqueue-many case.
MANY = 1_000


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
            results.append(_result(name, n, per_tx, n / outbox_s, n / plain_s, latencies))

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

        plain_s, _ = _timed(n, MANY, plain_many)
        outbox_s, latencies = _timed(n, MANY, outbox_many)
        results.append(_result("enqueue-many", n, MANY, n / outbox_s, n / plain_s, latencies))
    return results


def _result(
    name: str, n: int, per_tx: int, rate: float, ceiling: float, latencies: list[float]
) -> Result:
    many = name == "enqueue-many"
    return Result(
        scenario=name,
        n=n,
        actions_per_s=round(rate, 1),
        p50_ms=ms(percentile(latencies, 50)),
        p99_ms=ms(percentile(latencies, 99)),
        ratio=round(rate / ceiling, 3),
        ratio_to="plain-insert-many" if many else f"plain-insert-{name.removeprefix('enqueue-')}",
        extra={
            "per_transaction": per_tx,
            "ceiling_per_s": round(ceiling, 1),
            "latency_is": "one transaction (its enqueues and commit)",
        },
    )
