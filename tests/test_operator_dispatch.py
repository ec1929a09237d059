"""The operator's side with real claimer and worker processes: the attempt history of a worker
killed mid-write, a pause that a running claimer obeys, a cancel racing a claimer, and the
process registry."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
import redis
from dispatch_support import DispatchRig

from outbox.operator import (
    OperatorRefused,
    attempts_of,
    cancel,
    live_processes,
    pause,
    resume,
)
from tests.apps import dispatch_app

pytestmark = pytest.mark.slow

FAST = {
    "OUTBOX_LEASE_SECONDS": "4",
    "OUTBOX_WRITE_MARGIN_SECONDS": "1",
    "OUTBOX_POLL_INTERVAL_SECONDS": "0.5",
    "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "0.5",
    "OUTBOX_HEARTBEAT_INTERVAL_SECONDS": "0.5",
    "OUTBOX_POOL_SIZE": "8",
}


@pytest.fixture
def rig(database_url: str, schema: str, redis_url: str) -> Iterator[DispatchRig]:
    rig = DispatchRig(database_url, schema, redis_url, dict(FAST))
    rig.outbox().migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        dispatch_app.create_tables(conn, schema)
    try:
        yield rig
    finally:
        list(rig.stop_all())
        for proc in rig.processes:
            proc.log_path.unlink(missing_ok=True)
        client = redis.Redis.from_url(redis_url)
        for name in rig.queues:
            for key in client.scan_iter(match=f"*{name}*"):
                client.delete(key)


def _states(rig: DispatchRig, ids: list[int]) -> dict[int, dict]:
    with rig.connect() as conn:
        return {r["id"]: r for r in rig.actions(conn, ids)}


def test_a_killed_worker_leaves_its_attempt_on_record_as_lost(rig: DispatchRig) -> None:
    first = rig.worker(threads=4)
    rig.claimer()
    hang = {"hang_after_write_attempt": 1}
    [rb_id] = rig.enqueue(rig.rb, lanes=1, per_lane=1, payload=hang)
    [amo_id] = rig.enqueue(rig.amo, lanes=1, per_lane=1, payload=hang)
    rig.wait_rows("dispatch_effect", 2)
    first.kill()  # SIGKILL, inside the provider call
    rig.worker(threads=4)
    rig.wait_ended([rb_id, amo_id], timeout=60)
    with psycopg.connect(rig.database_url) as conn:
        rb = attempts_of(conn, rb_id, schema=rig.schema)
        amo = attempts_of(conn, amo_id, schema=rig.schema)
    # The read-back kind: the killed attempt (fenced, never finished) and the one that ran.
    assert [(a.attempt, a.result, a.lost) for a in rb] == [(1, None, True), (2, "DONE", False)]
    assert rb[0].fence_passed_at is not None and rb[0].ended_at is None
    assert rb[1].epoch > rb[0].epoch
    # The at-most-once kind: one attempt, ended by housekeeping when its lease was lost.
    assert [(a.attempt, a.result, a.reason, a.lost) for a in amo] == [
        (1, "UNCERTAIN", "LEASE_LOST_AFTER_WRITE", True)
    ]
    for a in (*rb, *amo):
        assert a.claimed_at <= a.taken_at
    # The second read-back attempt found the first one's write and did not write again.
    assert rb[0].taken_at <= rb[0].fence_passed_at and rb[1].fence_passed_at is None


def test_a_running_claimer_stops_claiming_a_paused_kind_until_resumed(rig: DispatchRig) -> None:
    rig.worker(threads=4)
    rig.claimer()
    with psycopg.connect(rig.database_url, autocommit=True) as conn:
        pause(conn, rig.rb, actor="ann", schema=rig.schema)
    paused_ids = rig.enqueue(rig.rb, lanes=3, per_lane=2)
    other_ids = rig.enqueue(rig.amo, lanes=3, per_lane=2)
    rig.wait_ended(other_ids, timeout=60)  # the claimer runs, and claims the other kind
    time.sleep(2.0)  # four claim rounds at least
    rows = _states(rig, paused_ids)
    assert {r["state"] for r in rows.values()} == {"ADMITTED"}
    assert {r["epoch"] for r in rows.values()} == {0}  # never claimed
    with psycopg.connect(rig.database_url, autocommit=True) as conn:
        assert resume(conn, rig.rb, actor="ann", schema=rig.schema)
    rows = rig.wait_ended(paused_ids, timeout=60)
    assert {r["state"] for r in rows} == {"DONE"}


def test_a_cancel_racing_a_claimer_either_wins_or_is_refused(rig: DispatchRig) -> None:
    ids = rig.enqueue(rig.rb, lanes=40, per_lane=3, payload={"sleep": 0.02})
    rig.worker(threads=8)
    rig.claimer()
    won: set[int] = set()
    refused: set[int] = set()

    def canceller(mine: list[int]) -> None:
        with psycopg.connect(rig.database_url, autocommit=True) as conn:
            for action_id in mine:
                try:
                    cancel(conn, action_id, actor="racer", schema=rig.schema)
                    won.add(action_id)
                except OperatorRefused:
                    refused.add(action_id)

    # From the back of each lane, so some cancels meet actions being claimed right then.
    order = sorted(ids, reverse=True)
    threads = [threading.Thread(target=canceller, args=(order[i::2],)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    rows = rig.wait_ended(ids, timeout=90)
    called = Counter(c["action_id"] for c in rig.calls())
    assert won | refused == set(ids) and not won & refused
    for row in rows:
        if row["id"] in won:
            assert (row["state"], row["stop_reason"]) == ("CANCELLED", "OPERATOR_CANCELLED")
            assert called[row["id"]] == 0, "a cancelled action ran"
        else:
            assert row["state"] == "DONE" and called[row["id"]] == 1
    assert won and refused, (len(won), len(refused))  # both sides of the race happened


def test_claimers_and_workers_keep_a_heartbeat(rig: DispatchRig) -> None:
    worker = rig.worker(threads=2)
    claimer = rig.claimer()
    deadline = time.monotonic() + 60
    with psycopg.connect(rig.database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            live = live_processes(conn, within=timedelta(seconds=5), schema=rig.schema)
            if {p.role for p in live} == {"claimer", "worker"}:
                break
            time.sleep(0.2)
        else:
            raise AssertionError(f"no heartbeat of both: {live}\n{rig.logs()}")
        by_role = {p.role: p for p in live}
        assert by_role["claimer"].pid == claimer.popen.pid
        assert sorted(by_role["claimer"].kinds) == sorted([rig.rb, rig.amo])
        first_seen = by_role["claimer"].last_seen
        time.sleep(1.5)
        again = {
            p.role: p for p in live_processes(conn, within=timedelta(seconds=5), schema=rig.schema)
        }
        assert again["claimer"].last_seen > first_seen
        # A clean stop takes the claimer's row away; a SIGKILLed worker leaves its row, which
        # stops being live and which maintenance deletes once stale.
        assert claimer.stop() == 0
        worker.kill()
        rows = conn.execute(
            f'SELECT role FROM "{rig.schema}".outbox_process ORDER BY role'
        ).fetchall()
        assert [r[0] for r in rows] == ["worker"]
        time.sleep(1.5)
        assert live_processes(conn, within=timedelta(seconds=1), schema=rig.schema) == []
    rig.claimer(OUTBOX_PROCESS_STALE_AFTER_SECONDS="1")
    deadline = time.monotonic() + 30
    with psycopg.connect(rig.database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            roles = [
                r[0]
                for r in conn.execute(f'SELECT role FROM "{rig.schema}".outbox_process').fetchall()
            ]
            if roles == ["claimer"]:
                break
            time.sleep(0.2)
        assert roles == ["claimer"], roles
