"""Faults a job system meets in production, with real claimer and worker processes: the broker
restarted (its queued messages lost) or down under a claimer, PostgreSQL restarted or down when
the processes start, the worker pool down for several leases, a claimer paused inside its claim,
a run that fails before its fence after an earlier run wrote. Servers a test stops or restarts
are its own (``benchmarks.chaos.servers``), never the shared ones. Each scenario checks the same
guarantees (``fault_support.assert_guarantees``): every action ends once, nothing ends uncalled
unless cancelled, no effect happens twice, lanes never overlap."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections import Counter

import psycopg
import pytest
from dispatch_support import APP, REPO, DispatchRig
from fault_support import (
    assert_guarantees,
    db_now,
    ended_count,
    fault_rig,
    max_gap,
    wait_until,
)

from benchmarks.chaos.servers import PrivatePostgres, PrivateRedis
from outbox.dispatch.processes import start_claimer, start_worker

pytestmark = pytest.mark.slow

LEASE = 3.0
#: The longest pause in finishing actions that a paused claimer may cause the others.
MAX_STALL = 2.5


def _mixed_work(rig: DispatchRig) -> list[int]:
    """Read-back actions on 30 lanes and at-most-once actions on 10, each taking a moment."""
    return rig.enqueue(rig.rb, lanes=30, per_lane=6, payload={"sleep": 0.05}) + rig.enqueue(
        rig.amo, lanes=10, per_lane=3, payload={"sleep": 0.05}
    )


def test_broker_restart_loses_its_queued_messages_but_no_action_for_good(
    database_url: str, schema: str, private_redis: PrivateRedis
) -> None:
    with fault_rig(database_url, schema, private_redis.url) as rig:
        rig.worker(threads=4)
        rig.claimer()
        rig.claimer()
        ids = _mixed_work(rig)
        wait_until(lambda: ended_count(rig, ids) >= 30, 30, "30 actions ended", rig)
        private_redis.restart(downtime=1.0)
        restarted = time.monotonic()
        rig.wait_ended(ids, timeout=45)
        print(f"\nall ended {time.monotonic() - restarted:.1f}s after the broker restart")
        assert_guarantees(rig, ids)
        assert all(p.popen.poll() is None for p in rig.processes), rig.logs()


def test_database_restart_mid_run_processes_reconnect_and_every_action_ends_once(
    private_postgres: PrivatePostgres, private_redis: PrivateRedis
) -> None:
    with fault_rig(private_postgres.url, "faults", private_redis.url) as rig:
        rig.worker(threads=4)
        rig.claimer()
        rig.claimer()
        ids = _mixed_work(rig)
        wait_until(lambda: ended_count(rig, ids) >= 30, 30, "30 actions ended", rig)
        private_postgres.restart(downtime=2.0)
        restarted = time.monotonic()
        rig.wait_ended(ids, timeout=45)
        print(f"\nall ended {time.monotonic() - restarted:.1f}s after the database restart")
        assert_guarantees(rig, ids)
        assert all(p.popen.poll() is None for p in rig.processes), rig.logs()


def test_a_database_outage_longer_than_three_heartbeats_gives_back_no_live_workers_attempt(
    private_postgres: PrivatePostgres, private_redis: PrivateRedis
) -> None:
    """Every process is silent while PostgreSQL is down, the live workers too: the claimers
    back first must not give back their unfenced attempts (each would cost an attempt and run
    again beside the first, which finds its fence refused)."""
    beat = 0.3  # the processes call a worker lost after 0.9 s of silence
    with fault_rig(
        private_postgres.url,
        "faults",
        private_redis.url,
        OUTBOX_LEASE_SECONDS="60",
        OUTBOX_WRITE_MARGIN_SECONDS="1",
        OUTBOX_HEARTBEAT_INTERVAL_SECONDS=str(beat),
        OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS="0.1",
    ) as rig:
        rig.worker(threads=4)
        for _ in range(4):  # each a chance to be back before the worker beats again
            rig.claimer()
        ids = rig.enqueue(rig.rb, lanes=8, per_lane=1, payload={"sleep": 8})
        rig.wait_rows("dispatch_call", len(ids))  # every attempt taken, waiting for its fence
        private_postgres.restart(downtime=10 * beat)
        rows = rig.wait_ended(ids, timeout=45)
        with rig.connect() as conn:
            lost = conn.execute(
                "SELECT action_id, attempt FROM faults.agent_action_attempt"
                " WHERE reason = 'WORKER_LOST'"
            ).fetchall()
        output = "\n".join(p.output() for p in rig.processes)
        # (The test app's provider is this database too: a call that met the restart may
        # retry, which is not a give-back.)
        assert (lost, "gave back" in output) == ([], False), output
        assert {r["state"] for r in rows} == {"DONE"}
        assert_guarantees(rig, ids)


def test_worker_pool_down_for_several_leases_spends_no_attempt_then_each_runs_once(
    database_url: str, schema: str, redis_url: str
) -> None:
    with fault_rig(database_url, schema, redis_url) as rig:
        rig.claimer()
        rig.claimer()
        ids = rig.enqueue(rig.rb, lanes=10, per_lane=2) + rig.enqueue(rig.amo, lanes=5, per_lane=1)
        # Longer than max_attempts (5) leases: a reclaim that spends an attempt would exhaust it.
        outage_end = time.monotonic() + 6 * LEASE
        most_attempts, ended = 0, 0
        with rig.connect() as conn:
            while time.monotonic() < outage_end:
                rows = rig.actions(conn, ids)
                most_attempts = max(most_attempts, *(r["attempt"] for r in rows))
                ended = max(ended, sum(r["state"] not in ("ADMITTED", "EXECUTING") for r in rows))
                time.sleep(0.5)
        assert (ended, most_attempts) == (0, 0), (
            f"with no worker running, {ended} actions ended and an action reached attempt "
            f"{most_attempts}\n{rig.logs()}"
        )
        rig.worker(threads=4)
        rows = rig.wait_ended(ids, timeout=30)
        assert Counter((r["state"], r["attempt"]) for r in rows) == {("DONE", 1): len(ids)}
        assert Counter(c["action_id"] for c in rig.calls()) == Counter(ids)
        assert_guarantees(rig, ids)


_CLAIM_LOCK_HELD = (
    "SELECT count(*) AS n FROM pg_locks l JOIN pg_stat_activity a USING (pid)"
    " WHERE l.locktype = 'advisory' AND l.classid = 2830 AND l.granted"
)


def _claim_lock_held(conn: psycopg.Connection, idle_for: str | None = None) -> bool:
    """Some session holds the claim lock (pg_advisory_xact_lock(2830, ...)); with ``idle_for``,
    one that has sat idle in its transaction that long: a claimer paused inside its claim."""
    sql = _CLAIM_LOCK_HELD
    if idle_for is not None:
        sql += (
            " AND a.state = 'idle in transaction'"
            f" AND a.state_change < clock_timestamp() - interval '{idle_for}'"
        )
    row = conn.execute(sql).fetchone()
    return bool(row and row["n"])


def _pause_inside_claim(rig: DispatchRig, pid: int, budget: float = 25.0) -> bool:
    """SIGSTOPs the claimer ``pid`` at a moment it holds the claim lock (the worst moment), or
    anywhere if that is not caught within ``budget`` seconds; True when caught.

    A round holds the lock for a few milliseconds, so stopping at random times catches it only
    now and then: the lock is watched instead, and the claimer stopped the moment some claimer
    holds it (the other claimer's round, or a stop that lands after the COMMIT was sent, is
    let go and tried again)."""
    deadline = time.monotonic() + budget
    with rig.connect() as conn:
        while time.monotonic() < deadline:
            if not _claim_lock_held(conn):
                time.sleep(0.0005)
                continue
            os.killpg(pid, signal.SIGSTOP)
            time.sleep(0.3)
            if _claim_lock_held(conn, idle_for="0.2 seconds"):
                return True
            os.killpg(pid, signal.SIGCONT)
            time.sleep(0.013)
    os.killpg(pid, signal.SIGSTOP)
    return False


def test_claimer_paused_30s_inside_its_claim_others_keep_claiming_and_nothing_runs_twice(
    database_url: str, schema: str, redis_url: str
) -> None:
    # A small batch: a claimer paused after its claim holds at most 2 of the 8 in-flight slots.
    with fault_rig(
        database_url, schema, redis_url, OUTBOX_IN_FLIGHT="8", OUTBOX_BATCH_SIZE="2"
    ) as rig:
        rig.worker(threads=8)
        paused = rig.claimer()
        rig.claimer()
        ids = rig.enqueue(rig.rb, lanes=160, per_lane=5, payload={"sleep": 0.3})
        wait_until(lambda: ended_count(rig, ids) >= 10, 30, "10 actions ended", rig)
        caught = _pause_inside_claim(rig, paused.pid)
        stopped_at = db_now(rig)
        try:
            time.sleep(30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(paused.pid, signal.SIGCONT)
        resumed_at = db_now(rig)
        rows = rig.wait_ended(ids, timeout=60)
        ends = [r["ended_at"] for r in rows if stopped_at <= r["ended_at"] <= resumed_at]
        # Up to the resume, or to the last end if the work ran out while paused.
        worked_on = any(r["ended_at"] > resumed_at for r in rows)
        window_end = resumed_at if worked_on else max(ends, default=stopped_at)
        gap = max_gap([stopped_at, *ends, window_end])
        print(
            f"\npaused inside its claim: {caught}; {len(ends)} ended while paused, gap {gap:.1f}s"
        )
        assert caught, "the claimer was never caught holding the claim lock"
        assert gap <= MAX_STALL, f"no action ended for {gap:.1f}s while a claimer was paused"
        assert Counter(c["action_id"] for c in rig.calls()) == Counter(ids), "an action ran twice"
        assert_guarantees(rig, ids)


def test_error_before_the_fence_after_an_earlier_write_keeps_it_so_read_back_writes_once(
    database_url: str, schema: str, redis_url: str
) -> None:
    with fault_rig(database_url, schema, redis_url) as rig:
        first = rig.worker(threads=2)
        rig.claimer()
        # Run 1 writes and hangs until killed; run 2's read-back search fails (before its fence,
        # so it is retried); run 3 must still know that run 1 wrote.
        payload = {"hang_after_write_attempt": 1, "fail_read_back_attempt": 2}
        [action_id] = rig.enqueue(rig.rb, lanes=1, per_lane=1, payload=payload)
        rig.wait_rows("dispatch_effect", 1)
        first.kill()
        rig.worker(threads=2)
        [row] = rig.wait_ended([action_id], timeout=40)
        assert (row["state"], row["attempt"]) == ("DONE", 3), row
        assert len(rig.effects()) == 1, "the read-back write happened twice"
        assert_guarantees(rig, [action_id])


def test_claimer_whose_broker_is_down_gives_its_claims_back_instead_of_holding_them_a_lease(
    database_url: str, schema: str, private_redis: PrivateRedis
) -> None:
    # A long lease: actions whose push failed and were held for it would still wait after the
    # broker came back.
    with fault_rig(database_url, schema, private_redis.url, OUTBOX_LEASE_SECONDS="20") as rig:
        rig.worker(threads=4)
        claimer = rig.claimer()
        private_redis.stop()
        ids = rig.enqueue(rig.rb, lanes=10, per_lane=2)
        time.sleep(3.0)  # the claimer meets the broker down
        private_redis.start()
        back = time.monotonic()
        rig.wait_ended(ids, timeout=15)
        print(f"\nall ended {time.monotonic() - back:.1f}s after the broker came back")
        assert time.monotonic() - back < 10, "claims whose push failed were held for the lease"
        assert claimer.popen.poll() is None, claimer.output()
        assert_guarantees(rig, ids)


def test_processes_started_while_the_database_is_down_wait_for_it_and_stop_on_sigterm(
    private_postgres: PrivatePostgres, private_redis: PrivateRedis
) -> None:
    with fault_rig(private_postgres.url, "faults", private_redis.url) as rig:
        ids = rig.enqueue(rig.rb, lanes=5, per_lane=2)
        private_postgres.stop()
        env = rig.env()
        claimer = start_claimer(APP, env, cwd=REPO, wait=False)
        worker = start_worker(APP, env, threads=2, cwd=REPO, wait=False)
        quitter = start_claimer(APP, env, cwd=REPO, wait=False)
        rig.processes += [claimer, worker, quitter]
        time.sleep(3.0)
        quitter.popen.send_signal(signal.SIGTERM)
        try:
            code = quitter.popen.wait(10)
        except subprocess.TimeoutExpired:
            code = None
        assert code is not None, "a process waiting for the database ignored SIGTERM"
        # Longer than any connect timeout: the processes must wait, not give up.
        time.sleep(35.0)
        assert claimer.popen.poll() is None, claimer.output()
        assert worker.popen.poll() is None, worker.output()
        private_postgres.start()
        rig.wait_ended(ids, timeout=30)
        assert_guarantees(rig, ids)
