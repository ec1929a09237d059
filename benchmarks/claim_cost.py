"""``claim-cost``: what one claim batch of 100 costs on (a) a small table, (b) one hot lane of
100,000 waiting actions plus 1,000 one-action lanes, (c) 1,000,000 ended actions in history,
(d) as (b) with priorities and limits on: the single lanes over 100 workspaces (the claim's fair
walk over limit keys) with three priorities, and a per-key concurrency cap.

Each timing is the real claim (``outbox.store.claim_operation``: the lane intake, then
``claim_heads``, which reclaims, walks the limit keys and claims) on a fresh transaction that is
rolled back, so every run claims the same heads; the median of several runs is reported, with
the buffers the ``claim_heads`` plan touched, its reclaims and key walk included (a number that
does not drift with the machine's load).
``ratio`` = each case's p50 over (a)'s.
"""

from __future__ import annotations

import json
import time
from datetime import timedelta
from typing import Any

import psycopg

from benchmarks.common import (
    DATABASE_URL,
    NOOP,
    Result,
    Scale,
    bench_schema,
    median,
    migrated_outbox,
    ms,
    percentile,
)
from outbox._io import run_sync
from outbox.queries import queries_for
from outbox.store import FAIR_KEYS_PER_CLAIM, claim_operation

#: The claim batch the issue names (and the default ``batch_size``).
BATCH = 100
LEASE = timedelta(minutes=5)


def _insert(conn: psycopg.Connection[Any], select: str, n: int) -> None:
    conn.execute(
        "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
        f" available_at) {select}",
        {"n": n, "kind": NOOP.name},
    )


def fill(schema: str, *, singles: int, hot: int = 0, ended: int = 0, workspaces: int = 0) -> None:
    """Loads a case. Waiting actions go through the real triggers (so the lane table is what
    production keeps); the ended history is written with triggers off (the guard would refuse an
    action born ended), which leaves the lane table alone, as ended actions do."""
    with psycopg.connect(DATABASE_URL) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        if ended:
            conn.execute("SET session_replication_role = replica")
            conn.execute(
                "INSERT INTO agent_action (kind, state, workspace_id, lane_key, idempotency_key,"
                " payload, attempt, epoch, available_at, stop_reason, created_at, ended_at)"
                " SELECT %(kind)s, 'DONE', 'w', 'old-' || g, 'old-' || g, NULL, 1, 1,"
                " now() - interval '2 days', 'DONE', now() - interval '2 days',"
                " now() - interval '1 day' FROM generate_series(1, %(n)s) g",
                {"n": ended, "kind": NOOP.name},
            )
            conn.execute("SET session_replication_role = origin")
        if hot:
            # Due before every single lane, so a claim meets the hot lane first.
            _insert(
                conn,
                "SELECT %(kind)s, 'w', 'hot', 'hot-' || g, '{}',"
                " now() - interval '1 day' + g * interval '1 ms' FROM generate_series(1, %(n)s) g",
                hot,
            )
        if workspaces:
            # Priorities and limits on: the single lanes spread over many workspaces (limit
            # keys), with three priorities.
            conn.execute(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key,"
                " payload, available_at, priority) SELECT %(kind)s, 'w' || (g %% %(w)s),"
                " 'single-' || g, 'single-' || g, '{}', now() - interval '1 hour', (g %% 3) * 10"
                " FROM generate_series(1, %(n)s) g",
                {"n": singles, "kind": NOOP.name, "w": workspaces},
            )
        else:
            _insert(
                conn,
                "SELECT %(kind)s, 'w', 'single-' || g, 'single-' || g, '{}',"
                " now() - interval '1 hour' FROM generate_series(1, %(n)s) g",
                singles,
            )
        conn.execute(queries_for(schema)["lane_intake"], {"limit": 10_000_000})  # as a claim does
        conn.commit()
        # Steady state: autovacuum has caught up behind the bulk load, as in production, and
        # the load's dirty pages are written out (a checkpoint the million-row load set off
        # otherwise runs during the next case's claims, and the case after the biggest load
        # timed it, not its claims).
        conn.autocommit = True
        conn.execute("VACUUM ANALYZE agent_action")
        conn.execute("VACUUM ANALYZE agent_action_lane")
        conn.execute("CHECKPOINT")


def time_claims(schema: str, runs: int, key_cap: int | None = None) -> tuple[list[float], int, int]:
    """Seconds of ``runs`` rolled-back claims (after one warm-up), the rows each claimed, and
    the buffers one ``claim_heads`` plan touched. ``key_cap``: a per-key concurrency cap on."""
    seconds: list[float] = []
    claimed = 0
    caps = {NOOP.name: key_cap} if key_cap else None
    with psycopg.connect(DATABASE_URL) as conn:
        for i in range(runs + 1):
            with conn.transaction(force_rollback=True):
                started = time.perf_counter()
                op = claim_operation(schema, {NOOP.name: BATCH}, LEASE, take=False, key_caps=caps)
                rows = run_sync(conn, op)
                took = time.perf_counter() - started
            if i:  # the first run warms the caches and the plan
                seconds.append(took)
            claimed = len(rows)
        with conn.transaction(force_rollback=True):
            (plan,) = conn.execute(
                "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries_for(schema)["claim_heads"],
                {
                    "kind": NOOP.name,
                    "limit": BATCH,
                    "lease": LEASE,
                    "take": False,
                    # The statement of a claim: it reclaims and walks the limit keys itself.
                    "reclaim": True,
                    "keys": None,
                    "after": "",
                    "walk": FAIR_KEYS_PER_CLAIM,
                    "per_key": None,
                    "key_cap": key_cap,
                },
            ).fetchone()
    top = (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
    return seconds, claimed, top["Shared Hit Blocks"] + top["Shared Read Blocks"]


CASES = (
    ("claim-cost-a", "small table: 1,000 one-action lanes", {"singles": 1_000}),
    (
        "claim-cost-b",
        "hot lane of 100,000 + 1,000 one-action lanes",
        {"singles": 1_000, "hot": 100_000},
    ),
    (
        "claim-cost-c",
        "1,000 one-action lanes + 1,000,000 ended actions",
        {"singles": 1_000, "ended": 1_000_000},
    ),
    (
        "claim-cost-d",
        "as (b), the single lanes over 100 workspaces with 3 priorities, a per-key cap of 10",
        {"singles": 1_000, "hot": 100_000, "workspaces": 100},
    ),
)


def run(scale: Scale) -> list[Result]:
    runs = scale.n(15, 101, floor=3)
    results: list[Result] = []
    base: float | None = None
    for name, what, sizes in CASES:
        sized = {k: scale.n(v, v, floor=min(v, 200)) for k, v in sizes.items()}
        if "workspaces" in sizes:
            sized["workspaces"] = sizes["workspaces"]
        with bench_schema(name) as schema:
            migrated_outbox(schema)
            loaded = time.perf_counter()
            fill(schema, **sized)
            load_s = time.perf_counter() - loaded
            key_cap = 10 if "workspaces" in sizes else None
            seconds, claimed, buffers = time_claims(schema, runs, key_cap)
        p50 = median(seconds)
        base = p50 if base is None else base
        results.append(
            Result(
                scenario=name,
                n=claimed,
                actions_per_s=round(claimed / p50, 1) if p50 else None,
                p50_ms=ms(p50),
                p99_ms=ms(percentile(seconds, 99)),
                ratio=round(p50 / base, 3),
                ratio_to="claim-cost-a",
                extra={
                    "case": what,
                    "sizes": sized,
                    "runs": runs,
                    "claim_heads_buffers": buffers,
                    "load_s": round(load_s, 1),
                },
            )
        )
    return results
