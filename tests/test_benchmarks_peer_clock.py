"""The procrastinate peer's lanes are checked from its events' times: a job of a lock must read
as starting after the lock's previous job ended, also when its worker's fetch began before that
end and chose it only once the end committed (as happens under load)."""

from __future__ import annotations

import asyncio
import time

import psycopg
import pytest

from benchmarks import lanes
from benchmarks.common import DATABASE_URL, bench_schema

pytest.importorskip("procrastinate")

from benchmarks.peers import procrastinate_runs  # after the skip: it imports procrastinate


def _connect(schema: str, *, autocommit: bool) -> psycopg.Connection:
    return psycopg.connect(DATABASE_URL, autocommit=autocommit, options=f"-c search_path={schema}")


def _fetch(conn: psycopg.Connection, worker: int) -> int | None:
    row = conn.execute("SELECT (procrastinate_fetch_job_v2(NULL, %s)).id", [worker]).fetchone()
    return row[0] if row else None


def test_a_fetch_begun_before_its_locks_previous_job_finished_reads_as_starting_after_it():
    with bench_schema("procrastinate_clock") as schema:
        asyncio.run(procrastinate_runs.install(schema))
        with (
            _connect(schema, autocommit=True) as worker_a,
            _connect(schema, autocommit=False) as worker_b,
        ):
            worker = worker_a.execute(
                "INSERT INTO procrastinate_workers DEFAULT VALUES RETURNING id"
            ).fetchone()[0]
            first, second = (
                worker_a.execute(
                    "INSERT INTO procrastinate_jobs (queue_name, task_name, lock)"
                    " VALUES ('q', 't', 'lane-0') RETURNING id"
                ).fetchone()[0]
                for _ in range(2)
            )
            assert _fetch(worker_a, worker) == first
            worker_b.execute("SELECT 1")  # its transaction (and its now()) starts here
            time.sleep(0.05)
            worker_a.execute("SELECT procrastinate_finish_job_v1(%s, 'succeeded', false)", [first])
            # The statement's snapshot sees the first job's end: the lock is free.
            assert _fetch(worker_b, worker) == second
            worker_b.commit()
            worker_a.execute("SELECT procrastinate_finish_job_v1(%s, 'succeeded', false)", [second])
            jobs = procrastinate_runs.records(worker_a, schema)
    lanes.check(jobs, 2, "procrastinate-clock")
