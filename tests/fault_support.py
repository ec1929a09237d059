"""What the fault tests share: a dispatch rig on any servers, and the guarantees every fault
scenario must keep, read back from the test app's rows (tests/apps/dispatch_app.py)."""

from __future__ import annotations

import contextlib
import itertools
import os
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import redis
from dispatch_support import ENDED, DispatchRig

from tests.apps import dispatch_app

#: A short lease, so that several leases pass within a test, and a small write margin.
FAULT_SETTINGS = {
    "OUTBOX_LEASE_SECONDS": "3",
    "OUTBOX_WRITE_MARGIN_SECONDS": "0.5",
    "OUTBOX_POLL_INTERVAL_SECONDS": "0.2",
    "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "0.5",
    "OUTBOX_IN_FLIGHT": "32",
    "OUTBOX_BATCH_SIZE": "16",
    "OUTBOX_POOL_SIZE": "4",
}


@contextmanager
def fault_rig(
    database_url: str, schema: str, broker_url: str, **settings: str
) -> Iterator[DispatchRig]:
    """A migrated schema with the test app's tables; its processes stopped and its Redis queues
    dropped afterwards, whatever happened."""
    rig = DispatchRig(database_url, schema, broker_url, {**FAULT_SETTINGS, **settings})
    rig.outbox().migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        dispatch_app.create_tables(conn, schema)
    try:
        yield rig
    finally:
        for proc in rig.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)  # a paused process must see its SIGTERM
        list(rig.stop_all())
        for proc in rig.processes:
            proc.log_path.unlink(missing_ok=True)
        client = redis.Redis.from_url(broker_url)
        try:
            for name in rig.queues:
                for key in client.scan_iter(match=f"*{name}*"):
                    client.delete(key)
        except redis.RedisError:
            pass


def db_now(rig: DispatchRig) -> Any:
    with rig.connect() as conn:
        row = conn.execute("SELECT clock_timestamp() AS now").fetchone()
    assert row is not None
    return row["now"]


def wait_until(predicate: Any, timeout: float, what: str, rig: DispatchRig) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout}s\n{rig.logs()}")
        time.sleep(0.1)


def ended_count(rig: DispatchRig, ids: list[int]) -> int:
    with rig.connect() as conn:
        return sum(r["state"] in ENDED for r in rig.actions(conn, ids))


def assert_guarantees(rig: DispatchRig, ids: list[int]) -> list[dict[str, Any]]:
    """Every action ended; none ended without an adapter call unless cancelled (expired or
    erased); effects: DONE exactly once, anything else at most once, an at-most-once action that
    FAILED or was CANCELLED never; per lane, calls in id order and never overlapping. Returns the
    action rows."""
    with rig.connect() as conn:
        rows = rig.actions(conn, ids)
    assert len(rows) == len(ids), "an action vanished"
    waiting = [r["id"] for r in rows if r["state"] not in ENDED]
    assert not waiting, f"actions not ended: {waiting[:10]}"
    calls = rig.calls()
    called = Counter(c["action_id"] for c in calls)
    effects = Counter(e["action_id"] for e in rig.effects())
    problems: list[str] = []
    for r in rows:
        n = effects[r["id"]]
        if r["state"] != "CANCELLED" and called[r["id"]] == 0:
            problems.append(f"action {r['id']} ended {r['state']} {r['stop_reason']} uncalled")
        allowed = (1,) if r["state"] == "DONE" else (0, 1)
        if r["kind"] == rig.amo and r["state"] in ("FAILED", "CANCELLED"):
            allowed = (0,)
        if n not in allowed:
            problems.append(f"action {r['id']} {r['state']} has {n} effects")
    problems += lane_problems(calls)
    assert not problems, "\n".join(problems[:20])
    return rows


def lane_problems(calls: list[dict[str, Any]]) -> list[str]:
    """Per lane: calls in action-id order, none starting before the one before it ended. A call
    with no recorded end (its process lost the database meanwhile) ended by its lease's end at
    the latest: the executor cancels an attempt there."""

    def end(call: dict[str, Any]) -> Any:
        return call["finished_at"] or call["started_at"] + timedelta(seconds=call["lease_left"])

    by_lane: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for call in sorted(calls, key=lambda c: c["started_at"]):
        by_lane[call["lane"]].append(call)
    problems = []
    for lane, lane_calls in by_lane.items():
        ids = [c["action_id"] for c in lane_calls]
        if ids != sorted(ids):
            problems.append(f"lane {lane} ran out of order: {ids}")
        held_until = None
        for call in lane_calls:
            if held_until is not None and call["started_at"] < held_until:
                problems.append(
                    f"lane {lane}: action {call['action_id']} overlapped the one before"
                )
            held_until = max(held_until or end(call), end(call))
    return problems


def max_gap(points: list[Any]) -> float:
    """The longest time between consecutive instants of ``points`` (sorted here), in seconds."""
    ordered = sorted(points)
    return max(((b - a).total_seconds() for a, b in itertools.pairwise(ordered)), default=0.0)
