"""``python -m benchmarks.console_plans [--rows N] [--with-indexes]``: the console's reads on a
large table, each with the plan PostgreSQL picks and its time (EXPLAIN ANALYZE), one line each.

Loads ``--rows`` actions (1M by default; about 3 minutes) into the schema ``bench_console``, 99%
of them ended (DONE, 2% FAILED, 0.1% UNCERTAIN; the last 1% waiting), and drops it afterwards.
``--with-indexes`` first adds the indexes the state, reason and lane filters would use, to show
what they change. Not one of the ``python -m benchmarks`` scenarios: it measures plans, not
throughput."""

from __future__ import annotations

import argparse
import os
import time
from datetime import timedelta

import psycopg

from outbox import Outbox
from outbox.console.reads import ActionFilter
from outbox.queries import queries_for

SCHEMA = "bench_console"
#: What the list's slow filters would need (one statement each; created concurrently in a
#: migration on a live table).
INDEXES = (
    "CREATE INDEX ON {s}.agent_action (state, id)",
    "CREATE INDEX ON {s}.agent_action (lane_key, id)",
    "CREATE INDEX ON {s}.agent_action ((coalesce(stop_reason, retry_reason)), id)",
    "CREATE INDEX ON {s}.agent_action (created_at)",
)


def load(url: str, rows: int) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")
    Outbox(url, schema=SCHEMA).migrate()
    ended = rows * 99 // 100
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {SCHEMA}.agent_action (kind, state, workspace_id, lane_key, "
            "idempotency_key, payload, subject_account_id) "
            "SELECT 'EMAIL', 'ADMITTED', 'w', 'lane-' || (g %% 50000), 'k' || g, '{}', "
            "CASE WHEN g %% 100 = 0 THEN 'acct-' || (g %% 5000) END "
            "FROM generate_series(1, %s) g",
            (rows,),
        )
        # Ended in bulk, bypassing the triggers (a real action gets there through EXECUTING).
        conn.execute(f"ALTER TABLE {SCHEMA}.agent_action DISABLE TRIGGER USER")
        conn.execute(
            f"UPDATE {SCHEMA}.agent_action SET "
            "state = CASE WHEN id %% 1000 = 7 THEN 'UNCERTAIN' WHEN id %% 50 = 3 THEN 'FAILED' "
            "ELSE 'DONE' END, "
            "stop_reason = CASE WHEN id %% 1000 = 7 THEN 'SMTP_DATA_TIMEOUT' "
            "WHEN id %% 50 = 3 THEN 'SMTP_RCPT_550' ELSE 'DONE' END, "
            "payload = NULL, attempt = 1, epoch = 1, "
            "ended_at = now() - ((id %% 86400) || ' seconds')::interval WHERE id <= %s",
            (ended,),
        )
        conn.execute(f"ALTER TABLE {SCHEMA}.agent_action ENABLE TRIGGER USER")
        conn.execute(f"VACUUM ANALYZE {SCHEMA}.agent_action")


def explain(conn: psycopg.Connection, sql: str, params: dict) -> tuple[float, str]:
    plan = [r[0] for r in conn.execute("EXPLAIN ANALYZE " + sql, params, prepare=False)]
    ms = float(next(line for line in plan if "Execution Time" in line).split()[2])
    scan = next((line.strip("-> ").split("  (")[0] for line in plan if "Scan" in line), "?")
    return ms, scan


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--with-indexes", action="store_true")
    args = parser.parse_args()
    url = os.environ.get("OUTBOX_TEST_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test")
    started = time.monotonic()
    load(url, args.rows)
    print(f"loaded {args.rows} actions in {time.monotonic() - started:.0f}s")
    q = queries_for(SCHEMA)
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            if args.with_indexes:
                for statement in INDEXES:
                    conn.execute(statement.format(s=SCHEMA))
                conn.execute(f"ANALYZE {SCHEMA}.agent_action")
            now = conn.execute("SELECT now()").fetchone()[0]  # type: ignore[index]
            filters = {
                "none": ActionFilter(),
                "state UNCERTAIN": ActionFilter(state="UNCERTAIN"),
                "state ADMITTED": ActionFilter(state="ADMITTED"),
                "reason": ActionFilter(reason="SMTP_DATA_TIMEOUT"),
                "lane": ActionFilter(lane_key="lane-7"),
                "idempotency key": ActionFilter(idempotency_key="k500"),
                "subject": ActionFilter(subject="acct-7"),
                "created, last 10 min": ActionFilter(since=now - timedelta(minutes=10)),
            }
            for name, where in filters.items():
                for before in (None, args.rows // 2):
                    params = {**where.params(), "before": before, "limit": 51}
                    ms, scan = explain(conn, q["console_actions_page"], params)
                    print(f"actions, {name:22} before={before!s:8} {ms:9.2f} ms  {scan}")
            for name, params in (
                ("console_uncertain_page", {"unresolved": True, "before": None, "limit": 51}),
                ("console_outcomes_per_minute", {}),
                ("console_blocked_lanes", {"limit": 100}),
            ):
                ms, scan = explain(conn, q[name], params)
                print(f"{name:52} {ms:9.2f} ms  {scan}")
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {SCHEMA} CASCADE")


if __name__ == "__main__":
    main()
