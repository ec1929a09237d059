"""``claim-cost``: what one claim batch of 100 costs on (a) a small table, (b) one hot lane of
100,000 waiting actions plus 1,000 one-action lanes, (c) 1,000,000 ended actions in history,
(d) as (b) with priorities and limits on: the single lanes over 100 workspaces (the claim's fair
walk over limit keys) with three priorities, and a per-key concurrency cap, (e) as (a) with
100,000 lanes scheduled for tomorrow over 10,000 workspaces that come before the due lanes' in
key order (a reminder a user): a claim walks only keys with something due.

Each timing is the real claim (``outbox.store.claim_operation``: the lane intake, then
``claim_heads``, which reclaims, walks the limit keys and claims), its statements prepared as a
claimer's are, on a fresh transaction that is rolled back, so every run claims the same heads;
the median of several runs is reported, with the buffers the ``claim_heads`` plan touched, its
reclaims and key walk included (a number that does not drift with the machine's load).
``ratio`` = each case's p50 over (a)'s.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
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
from outbox.store import CAPPED_KEYS_PER_CLAIM, FAIR_KEYS_PER_CLAIM, claim_operation

#: The claim batch the issue names (and the default ``batch_size``).
BATCH = 100
LEASE = timedelta(minutes=5)
#: Untimed claims of each case first: psycopg prepares a statement at its sixth run (its
#: default ``prepare_threshold`` of 5), so every timed claim runs prepared, as a claimer's do.
WARM_UP = 6


def _insert(conn: psycopg.Connection[Any], select: str, n: int) -> None:
    conn.execute(
        "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
        f" available_at) {select}",
        {"n": n, "kind": NOOP.name},
    )


def fill(
    schema: str,
    *,
    singles: int,
    hot: int = 0,
    ended: int = 0,
    workspaces: int = 0,
    scheduled: int = 0,
) -> None:
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
        if scheduled:
            # Tomorrow's reminders, ten lanes a workspace, the workspaces before the single
            # lanes' "w" in key order (where a claim's walk begins).
            _insert(
                conn,
                "SELECT %(kind)s, 'a' || lpad((g %% greatest(%(n)s / 10, 1))::text, 6, '0'),"
                " 'later-' || g, 'later-' || g, '{}',"
                " now() + interval '1 day' + g * interval '1 ms' FROM generate_series(1, %(n)s) g",
                scheduled,
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


def _server_cpu(conn: psycopg.Connection[Any]) -> Callable[[], float] | None:
    """A clock of the CPU time ``conn``'s server process has used (seconds), when the server
    runs on this machine (Linux's schedstat); None otherwise."""
    (pid,) = conn.execute("SELECT pg_backend_pid()").fetchone() or (0,)
    path = Path(f"/proc/{pid}/schedstat")

    def used() -> float:
        return int(path.read_text().split()[0]) / 1e9

    try:
        used()
    except OSError:
        return None
    return used


class Case:
    """One loaded case: what it is, its connection, and each timed claim's seconds and server
    CPU."""

    def __init__(
        self, name: str, what: str, sized: dict[str, int], schema: str, load_s: float
    ) -> None:
        self.name, self.what, self.sized, self.load_s = name, what, sized, load_s
        self.schema = schema
        #: A per-key concurrency cap, in the case with limit keys.
        self.key_cap = 10 if "workspaces" in sized else None
        self.conn = psycopg.connect(DATABASE_URL)
        self.cpu = _server_cpu(self.conn)
        self.seconds: list[float] = []
        self.cpu_seconds: list[float] = []
        self.claimed = 0

    def claim(self, timed: bool) -> None:
        """One claim of a batch, rolled back (so every run claims the same heads).

        The ROLLBACK goes to libpq directly: psycopg forgets its prepared statements at any
        rollback it runs, and the claim's statements would then be parsed and planned anew at
        every run, where a claimer, whose rounds commit, runs them prepared. (The server keeps
        a prepared statement across a rollback.)"""
        cpu_before = self.cpu() if self.cpu else 0.0
        caps = {NOOP.name: self.key_cap} if self.key_cap else None
        op = claim_operation(self.schema, {NOOP.name: BATCH}, LEASE, take=False, key_caps=caps)
        try:
            started = time.perf_counter()
            rows = run_sync(self.conn, op)
            took = time.perf_counter() - started
        finally:
            self.conn.pgconn.exec_(b"ROLLBACK")
        if timed:
            self.seconds.append(took)
            if self.cpu:
                self.cpu_seconds.append(self.cpu() - cpu_before)
        self.claimed = len(rows)

    def buffers(self) -> int:
        """The buffers one ``claim_heads`` plan touched."""
        return explain_claim_heads(self.conn, self.schema, self.key_cap)[0]


def explain_claim_heads(
    conn: psycopg.Connection[Any], schema: str, key_cap: int | None = None
) -> tuple[int, float]:
    """The buffers one ``claim_heads`` plan of a batch of the no-op kind touched on ``schema``
    (its reclaims and limit-key walk included), and its execution's ms, rolled back."""
    with conn.transaction(force_rollback=True):
        row = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + queries_for(schema)["claim_heads"],
            {
                "kind": NOOP.name,
                "limit": BATCH,
                "lease": LEASE,
                "take": False,
                "claimer": None,
                # The statement of a claim: it reclaims and walks the limit keys itself.
                "reclaim": True,
                "heads": True,
                "keys": None,
                "after": "",
                "walk": FAIR_KEYS_PER_CLAIM,
                "steps": FAIR_KEYS_PER_CLAIM + CAPPED_KEYS_PER_CLAIM,
                "per_key": None,
                "key_cap": key_cap,
            },
        ).fetchone()
    assert row is not None
    plan = row[0]
    explained = (plan if isinstance(plan, list) else json.loads(plan))[0]
    top = explained["Plan"]
    return int(top["Shared Hit Blocks"] + top["Shared Read Blocks"]), explained["Execution Time"]


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
    (
        "claim-cost-e",
        "1,000 one-action lanes + 100,000 lanes scheduled for tomorrow over 10,000 workspaces",
        {"singles": 1_000, "scheduled": 100_000},
    ),
)


def run(scale: Scale) -> list[Result]:
    """Loads every case (each in a schema of its own), then times their claims in turns (a, b,
    c, d, a, b, ...): a pause of the machine lands on every case alike, not on one case's
    whole sample, so the ratios hold on a noisy machine."""
    runs = scale.n(41, 101, floor=3)
    with contextlib.ExitStack() as stack:
        cases: list[Case] = []
        for name, what, sizes in CASES:
            sized = {k: scale.n(v, v, floor=min(v, 200)) for k, v in sizes.items()}
            if "workspaces" in sizes:
                sized["workspaces"] = sizes["workspaces"]
            schema = stack.enter_context(bench_schema(name))
            migrated_outbox(schema)
            loaded = time.perf_counter()
            fill(schema, **sized)
            case = Case(name, what, sized, schema, time.perf_counter() - loaded)
            stack.callback(case.conn.close)
            cases.append(case)
        for case in cases:
            # Warms the caches, and runs the claim's statements until psycopg prepares them.
            for _ in range(WARM_UP):
                case.claim(timed=False)
        for _ in range(runs):
            for case in cases:
                case.claim(timed=True)
        results: list[Result] = []
        base_p50 = median(cases[0].seconds)
        base_cpu = median(cases[0].cpu_seconds) if cases[0].cpu_seconds else None
        for case in cases:
            p50 = median(case.seconds)
            cpu = median(case.cpu_seconds) if case.cpu_seconds else None
            results.append(
                Result(
                    scenario=case.name,
                    n=case.claimed,
                    actions_per_s=round(case.claimed / p50, 1) if p50 else None,
                    p50_ms=ms(p50),
                    p99_ms=ms(percentile(case.seconds, 99)),
                    ratio=round(p50 / base_p50, 3),
                    ratio_to="claim-cost-a",
                    extra={
                        "case": case.what,
                        "sizes": case.sized,
                        "runs": runs,
                        "claim_heads_buffers": case.buffers(),
                        # The server's CPU for one claim, median: the load of the machine
                        # hardly moves it (None when the server runs elsewhere).
                        "server_cpu_ms": ms(cpu) if cpu is not None else None,
                        "server_cpu_ratio": round(cpu / base_cpu, 3)
                        if cpu is not None and base_cpu
                        else None,
                        "load_s": round(case.load_s, 1),
                    },
                )
            )
    return results
