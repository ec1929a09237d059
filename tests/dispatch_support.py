"""What the dispatch tests share: the test app's environment, enqueueing, waiting, read-back."""

from __future__ import annotations

import itertools
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
from psycopg.rows import dict_row

from outbox import ActionRequest, Outbox
from outbox.dispatch.processes import OutboxProcess, start_claimer, start_worker
from tests.apps import dispatch_app

APP = "tests.apps.dispatch_app:make_outbox"
REPO = str(Path(__file__).resolve().parent.parent)
ENDED = ("DONE", "UNCERTAIN", "FAILED", "CANCELLED")


@dataclass
class DispatchRig:
    """One test's app: its schema, kinds, broker URL, and the processes it started."""

    database_url: str
    schema: str
    broker_url: str
    settings: dict[str, str]
    processes: list[OutboxProcess] = field(default_factory=list)

    @property
    def suffix(self) -> str:
        return self.schema.upper()

    @property
    def rb(self) -> str:
        return dispatch_app.kinds(self.suffix)[0].name

    @property
    def amo(self) -> str:
        return dispatch_app.kinds(self.suffix)[1].name

    @property
    def queues(self) -> list[str]:
        return [k.queue_name for k in dispatch_app.kinds(self.suffix)]

    def env(self, **extra: str) -> dict[str, str]:
        return {
            "OUTBOX_DATABASE_URL": self.database_url,
            "OUTBOX_SCHEMA": self.schema,
            "OUTBOX_BROKER_URL": self.broker_url,
            "DISPATCH_APP_SUFFIX": self.suffix,
            "PYTHONPATH": REPO,
            **self.settings,
            **extra,
        }

    def outbox(self) -> Outbox:
        """The app as the test process sees it (same kinds and settings as the processes)."""
        return dispatch_app.build(self.database_url, self.schema, self.suffix)

    def claimer(self, **extra: str) -> OutboxProcess:
        proc = start_claimer(APP, self.env(**extra), cwd=REPO)
        self.processes.append(proc)
        return proc

    def worker(self, processes: int = 1, threads: int = 4, **extra: str) -> OutboxProcess:
        proc = start_worker(APP, self.env(**extra), processes=processes, threads=threads, cwd=REPO)
        self.processes.append(proc)
        return proc

    def connect(self) -> psycopg.Connection[Any]:
        return psycopg.connect(self.database_url, autocommit=True, row_factory=dict_row)

    def enqueue(
        self, kind: str, lanes: int, per_lane: int, payload: dict[str, Any] | None = None
    ) -> list[int]:
        """``lanes * per_lane`` actions, interleaved across lanes, in one transaction."""
        outbox = self.outbox()
        ids = []
        with psycopg.connect(self.database_url) as conn:
            for i in range(per_lane):
                for lane in range(lanes):
                    action = outbox.enqueue(
                        conn,
                        ActionRequest(
                            kind=kind,
                            workspace_id="w1",
                            lane_key=f"{kind}-lane-{lane}",
                            idempotency_key=f"{kind}-{lane}-{i}",
                            payload=payload or {},
                        ),
                    )
                    ids.append(action.id)
        return ids

    def wait_ended(self, ids: list[int], timeout: float = 60.0) -> list[dict[str, Any]]:
        """Every action of ``ids``, once all ended; fails with the processes' logs otherwise."""
        deadline = time.monotonic() + timeout
        with self.connect() as conn:
            while True:
                rows = self.actions(conn, ids)
                if all(r["state"] in ENDED for r in rows):
                    return rows
                if time.monotonic() > deadline:
                    waiting = [r for r in rows if r["state"] not in ENDED]
                    raise AssertionError(
                        f"{len(waiting)} of {len(ids)} not ended after {timeout}s, e.g. "
                        f"{waiting[:3]}\n" + self.logs()
                    )
                time.sleep(0.1)

    def actions(self, conn: psycopg.Connection[Any], ids: list[int]) -> list[dict[str, Any]]:
        return conn.execute(
            f'SELECT * FROM "{self.schema}".agent_action WHERE id = ANY(%s) ORDER BY id', (ids,)
        ).fetchall()

    def calls(self) -> list[dict[str, Any]]:
        with self.connect() as conn:
            return conn.execute(
                f'SELECT * FROM "{self.schema}".dispatch_call ORDER BY id'
            ).fetchall()

    def effects(self) -> list[dict[str, Any]]:
        with self.connect() as conn:
            return conn.execute(
                f'SELECT * FROM "{self.schema}".dispatch_effect ORDER BY id'
            ).fetchall()

    def wait_rows(self, table: str, count: int, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        with self.connect() as conn:
            while time.monotonic() < deadline:
                n = conn.execute(f'SELECT count(*) AS n FROM "{self.schema}".{table}').fetchone()
                if n and n["n"] >= count:
                    return
                time.sleep(0.05)
        raise AssertionError(f"fewer than {count} rows in {table} after {timeout}s\n{self.logs()}")

    def logs(self) -> str:
        return "\n".join(f"--- {p.argv}\n{p.output()[-4000:]}" for p in self.processes)

    def stop_all(self) -> Iterator[int]:
        """Asks every process to stop at once, then waits for each (exit codes in order)."""
        for proc in self.processes:
            if proc.popen.poll() is None:
                proc.popen.send_signal(signal.SIGTERM)
        for proc in self.processes:
            yield proc.stop()


def assert_lanes_held(calls: list[dict[str, Any]]) -> None:
    """Per lane: calls in action-id order, and none started before the one before it ended."""
    by_lane: dict[str, list[dict[str, Any]]] = {}
    for call in sorted(calls, key=lambda c: c["started_at"]):
        by_lane.setdefault(call["lane"], []).append(call)
    for lane, lane_calls in by_lane.items():
        ids = [c["action_id"] for c in lane_calls]
        assert ids == sorted(ids), f"lane {lane} ran out of order: {ids}"
        for before, after in itertools.pairwise(lane_calls):
            assert before["finished_at"] is not None
            assert after["started_at"] >= before["finished_at"], (
                f"lane {lane}: action {after['action_id']} started before "
                f"{before['action_id']} ended"
            )


def app_schema(database_url: str, schema: str) -> DispatchRig:
    """The test app's schema, migrated, for tests that claim and take from this process (no
    broker, no processes)."""
    rig = DispatchRig(database_url, schema, "", {})
    rig.outbox().migrate()
    return rig


def heartbeat_row(
    conn: psycopg.Connection[Any],
    process_id: str,
    role: str,
    silent_for: float,
    beating_for: float = 3600.0,
) -> None:
    """A process's heartbeat row, last seen ``silent_for`` seconds ago after an unbroken run of
    beats that began ``beating_for`` seconds ago (``conn`` on the schema's search path)."""
    conn.execute(
        "INSERT INTO outbox_process"
        " (process_id, role, host, pid, started_at, last_seen, beating_since)"
        " VALUES (%s, %s, 'h', 1, now() - interval '1 hour', now() - make_interval(secs => %s),"
        " now() - make_interval(secs => %s))",
        (process_id, role, silent_for, beating_for),
    )


#: The judging claimer "me" under a 5-s heartbeat, facing a process silent for 16 s: how long ago
#: it last beat, how long its beats have run unbroken, and how many of two claims or attempts it
#: gives back (``outbox_claimer_may_judge``).
JUDGES = [
    (0, 14.9, 0),  # back in touch with the database for less than the silence
    (7.6, 3600, 0),  # its own last beat is older than 1.5 intervals: cut off itself
    (0, 15.1, 2),  # beating unbroken for longer than the silence: the other process is lost
]


def judge_row(conn: psycopg.Connection[Any], beating_for: float = 3600.0) -> None:
    """The heartbeat row of the claimer "me" whose housekeeping judges the others: it beat just
    now, its beats unbroken for ``beating_for`` seconds."""
    heartbeat_row(conn, "me", "claimer", 0, beating_for)
