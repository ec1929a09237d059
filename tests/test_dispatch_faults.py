"""Dispatch under faults, with real processes and private servers (benchmarks/chaos/servers.py): a
claimer paused inside its claim round, a broker stopped or stalled, PostgreSQL down at start,
and forged messages on a real queue. The shared services are never stopped."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from dispatch_support import APP, REPO, DispatchRig, assert_lanes_held
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from benchmarks.chaos.servers import PrivatePostgres, PrivateRedis
from outbox import ActionRequest
from outbox.dispatch import Claimer, broker_from_url, install
from outbox.dispatch.actors import BIGINT_MAX
from outbox.dispatch.processes import OutboxProcess, start_claimer, start_worker
from outbox.fence_token import FenceToken
from outbox.store import release_claims_operation
from tests.apps import dispatch_app

FAST = {
    "OUTBOX_LEASE_SECONDS": "30",
    "OUTBOX_WRITE_MARGIN_SECONDS": "1",
    "OUTBOX_POLL_INTERVAL_SECONDS": "0.5",
    "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "0.5",
    "OUTBOX_PUSH_TIMEOUT_SECONDS": "1",
    "OUTBOX_POOL_SIZE": "8",
}


def _forget_queues(rig: DispatchRig) -> None:
    client = redis.Redis.from_url(rig.broker_url, socket_timeout=2)
    for name in rig.queues:
        for key in client.scan_iter(match=f"*{name}*"):
            client.delete(key)


def _make_rig(database_url: str, schema: str, broker_url: str) -> Iterator[DispatchRig]:
    rig = DispatchRig(database_url, schema, broker_url, dict(FAST))
    rig.outbox().migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        dispatch_app.create_tables(conn, schema)
    try:
        yield rig
    finally:
        list(rig.stop_all())
        for proc in rig.processes:
            proc.log_path.unlink(missing_ok=True)
        with contextlib.suppress(redis.RedisError):
            _forget_queues(rig)


@pytest.fixture
def rig(database_url: str, schema: str, redis_url: str) -> Iterator[DispatchRig]:
    yield from _make_rig(database_url, schema, redis_url)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    with PrivateRedis() as server:
        yield server


@pytest.fixture
def private_rig(
    database_url: str, schema: str, private_redis: PrivateRedis
) -> Iterator[DispatchRig]:
    yield from _make_rig(database_url, schema, private_redis.url)


def _enqueue(rig: DispatchRig, tag: str, n: int, lanes: int = 0) -> list[int]:
    """``n`` read-back actions of their own keys (``tag``), over ``lanes`` lanes (or n)."""
    outbox = rig.outbox()
    with psycopg.connect(rig.database_url) as conn:
        return [
            outbox.enqueue(
                conn,
                ActionRequest(
                    kind=rig.rb,
                    workspace_id="w1",
                    lane_key=f"{tag}-lane-{i % (lanes or n)}",
                    idempotency_key=f"{tag}-{i}",
                    payload={},
                ),
            ).id
            for i in range(n)
        ]


def _states(rig: DispatchRig, ids: list[int]) -> Counter[str]:
    with rig.connect() as conn:
        return Counter(r["state"] for r in rig.actions(conn, ids))


def _assert_each_ran_once(rig: DispatchRig, ids: list[int]) -> None:
    rows = rig.wait_ended(ids, timeout=30)
    assert Counter(r["state"] for r in rows) == {"DONE": len(ids)}
    effects = Counter(e["action_id"] for e in rig.effects())
    assert set(effects) == set(ids) and set(effects.values()) == {1}, "an action ran twice"
    calls = rig.calls()
    assert Counter(c["action_id"] for c in calls) == Counter(ids)
    assert_lanes_held(calls)


def _given_back(reason: str) -> float:
    """This process's ``outbox_claims_given_back_total`` for ``reason``."""
    return REGISTRY.get_sample_value("outbox_claims_given_back_total", {"reason": reason}) or 0.0


def _process_state(pid: int) -> str:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


# -- one claimer never holds up another ------------------------------------------------------


@pytest.mark.slow
def test_a_claimer_paused_inside_its_claim_round_holds_up_the_other_for_seconds_only(
    rig: DispatchRig, tmp_path: Path
) -> None:
    marker = tmp_path / "stopped"
    env = {"DISPATCH_APP_STOP_IN_CLAIM": str(marker)}
    rig.worker(threads=8)
    first, second = rig.claimer(**env), rig.claimer(**env)
    ids = _enqueue(rig, "warm", 10)
    rig.wait_ended(ids, timeout=30)

    # The next round of either claimer stops itself while it holds the claim lock.
    Path(f"{marker}.arm").touch()
    deadline = time.monotonic() + 10
    while not (marker.exists() and marker.read_text()):
        assert time.monotonic() < deadline, "no claimer reached its claim lock\n" + rig.logs()
        time.sleep(0.02)
    stopped_pid = int(marker.read_text())
    stopped, other = (first, second) if first.pid == stopped_pid else (second, first)
    while _process_state(stopped_pid) != "T":
        time.sleep(0.01)
    paused_at = time.monotonic()

    latencies = []
    wave = 0
    while time.monotonic() - paused_at < 30:
        wave_ids = _enqueue(rig, f"wave{wave}", 4)
        started = time.monotonic()
        rig.wait_ended(wave_ids, timeout=15)
        latencies.append(time.monotonic() - started)
        ids += wave_ids
        wave += 1
        time.sleep(max(0.0, 2.5 - latencies[-1]))
    assert _process_state(stopped_pid) == "T", "the paused claimer ran meanwhile"
    print(f"\n{wave} waves while a claimer was paused 30 s; latencies {latencies}")
    assert max(latencies) < 5, f"a wave waited for the paused claimer: {latencies}"
    assert "for the claim lock" in other.output() or "claim lock not granted" in other.output()

    os.kill(stopped_pid, signal.SIGCONT)
    stopped.wait_for("claim round failed")
    assert "idle-in-transaction" in stopped.output(), stopped.output()[-2000:]
    # The resumed claimer alone serves the next actions.
    assert other.stop() == 0
    last = _enqueue(rig, "after", 6)
    rig.wait_ended(last, timeout=10)
    _assert_each_ran_once(rig, ids + last)


# -- a broker that is down or stalls ---------------------------------------------------------


@pytest.mark.slow
def test_broker_stopped_mid_run_claims_are_given_back_at_once_and_resume_after_restart(
    private_rig: DispatchRig, private_redis: PrivateRedis
) -> None:
    rig = private_rig
    rig.worker(threads=8)
    claimer = rig.claimer()
    before = _enqueue(rig, "before", 10)
    rig.wait_ended(before, timeout=30)

    private_redis.stop()
    during = _enqueue(rig, "during", 10)
    claimer.wait_for("gave back", timeout=10)
    # Never EXECUTING for a lease (30 s) because of a failed push: all due again at once.
    deadline = time.monotonic() + 4
    while time.monotonic() < deadline:
        states = _states(rig, during)
        assert states["EXECUTING"] == 0 or time.monotonic() < deadline - 3, states
        time.sleep(0.2)
    assert _states(rig, during) == {"ADMITTED": 10}, rig.logs()

    private_redis.start()
    restarted = time.monotonic()
    rig.wait_ended(during, timeout=20)
    print(f"\nended {time.monotonic() - restarted:.1f}s after the broker came back (lease 30 s)")
    assert "broker answers again" in claimer.output()
    _assert_each_ran_once(rig, before + during)


@pytest.mark.slow
def test_a_broker_that_restarted_empty_gets_back_the_claims_it_held_at_once(
    private_rig: DispatchRig, private_redis: PrivateRedis
) -> None:
    """A Redis restart without persistence loses every queued message: their claims are given
    back as soon as the claimer sees the new run, not after their lease (30 s here)."""
    rig = private_rig
    claimer = rig.claimer()
    ids = _enqueue(rig, "held", 10)
    # No worker yet: the pushed messages wait in the broker.
    deadline = time.monotonic() + 10
    while _states(rig, ids) != {"EXECUTING": 10}:
        assert time.monotonic() < deadline, _states(rig, ids)
        time.sleep(0.1)

    private_redis.restart()
    restarted = time.monotonic()
    rig.worker(threads=8)
    rig.wait_ended(ids, timeout=20)
    print(f"\nended {time.monotonic() - restarted:.1f}s after the broker restarted (lease 30 s)")
    assert "the broker restarted" in claimer.output()
    _assert_each_ran_once(rig, ids)


async def test_claims_given_back_after_a_restart_run_once_when_their_messages_survived(
    make_outbox: Any, schema: str, redis_url: str
) -> None:
    """A broker that restarted with its messages (persistence), or whose run the claimer
    misread: each claim is given back and pushed again under a new epoch, and the message of
    the old epoch is dropped by the take. Nothing runs twice."""
    outbox = dispatch_app.build(
        make_outbox().settings.require_database_url(), schema, schema.upper()
    )
    outbox.migrate()
    dispatch = install(outbox, broker_from_url(redis_url))
    rig = DispatchRig(outbox.settings.require_database_url(), schema, redis_url, dict(FAST))
    with psycopg.connect(rig.database_url, autocommit=True) as conn:
        dispatch_app.create_tables(conn, schema)
    try:
        ids = await asyncio.to_thread(_enqueue, rig, "survived", 6)
        async with outbox.store() as store:
            claimer = Claimer(dispatch, store)
            runs = iter(["run-a", "run-a", "run-b"])
            claimer.restart_watch.identity = lambda: next(runs)
            claimer.restart_watch.every = 0.0  # a look every round
            counted = _given_back("broker_restarted")
            first = await claimer.run_once(housekeeping=False)
            assert first.pushed == 6
            await claimer.run_once(housekeeping=False)  # the same run: nothing given back
            assert claimer.totals["released_after_restart"] == 0
            again = await claimer.run_once(housekeeping=False)
            assert claimer.totals["released_after_restart"] == 6
            assert _given_back("broker_restarted") == counted + 6
            assert again.pushed == 6, "given back and pushed again under a new epoch"
        with rig.connect() as conn:
            assert {r["epoch"] for r in rig.actions(conn, ids)} == {2}
        # Twelve messages for six actions: the six of epoch 1 are dropped by the take.
        worker = rig.worker(threads=4)
        await asyncio.to_thread(_assert_each_ran_once, rig, ids)
        assert worker.output().count("abandoned message for action") == 6, worker.output()
    finally:
        list(rig.stop_all())
        with contextlib.suppress(redis.RedisError):
            _forget_queues(rig)


async def test_a_stalled_broker_never_freezes_the_claimers_loop(
    make_outbox: Any, schema: str, private_redis: PrivateRedis
) -> None:
    outbox = dispatch_app.build(
        make_outbox().settings.require_database_url(),
        schema,
        schema.upper(),
        push_timeout=timedelta(seconds=1),
        poll_interval=timedelta(seconds=0.2),
        housekeeping_interval=timedelta(seconds=0.2),
    )
    outbox.migrate()
    dispatch = install(outbox, broker_from_url(private_redis.url))
    rig = DispatchRig(outbox.settings.require_database_url(), schema, private_redis.url, {})
    stop = asyncio.Event()
    gaps: list[float] = []

    async def ticker() -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(0.05)
            now = time.monotonic()
            gaps.append(now - last)
            last = now

    async with outbox.store() as store:
        claimer = Claimer(dispatch, store)
        tasks = [asyncio.create_task(claimer.run(stop)), asyncio.create_task(ticker())]
        first = await asyncio.to_thread(_enqueue, rig, "first", 5)
        while claimer.totals["pushed"] < 5:
            await asyncio.sleep(0.05)

        private_redis.pause()
        try:
            rounds, housekeeping = claimer.totals["rounds"], claimer.totals["housekeeping"]
            gaps.clear()
            stalled = await asyncio.to_thread(_enqueue, rig, "stalled", 5)
            await asyncio.sleep(6)
            assert max(gaps) < 0.5, f"the loop froze for {max(gaps):.1f}s"
            assert claimer.totals["rounds"] > rounds + 5
            assert claimer.totals["housekeeping"] > housekeeping + 5
            assert claimer.totals["released"] >= 5
            assert _given_back("push_failed") >= claimer.totals["released"]
            assert await asyncio.to_thread(_states, rig, stalled) == {"ADMITTED": 5}
        finally:
            private_redis.resume()

        while claimer.totals["pushed"] < 10:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 10)
    states = await asyncio.to_thread(_states, rig, first + stalled)
    assert states == {"EXECUTING": 10}


def test_claimer_waits_for_an_unreachable_broker_at_start_and_stops_on_sigterm(
    private_rig: DispatchRig, private_redis: PrivateRedis
) -> None:
    rig = private_rig
    private_redis.stop()
    waiting = start_claimer(APP, rig.env(), cwd=REPO, wait=False)
    stopping = start_claimer(APP, rig.env(), cwd=REPO, wait=False)
    rig.processes += [waiting, stopping]
    waiting.wait_for("broker unreachable", count=2, timeout=15)
    stopping.wait_for("broker unreachable", timeout=15)
    asked = time.monotonic()
    assert stopping.stop(timeout=5) == 0
    assert time.monotonic() - asked < 1.5
    assert "claimer started" not in waiting.output()

    private_redis.start()
    waiting.wait_for("claimer started", timeout=15)
    ids = _enqueue(rig, "late", 3)
    with rig.connect() as conn:
        deadline = time.monotonic() + 15
        while {r["state"] for r in rig.actions(conn, ids)} != {"EXECUTING"}:
            assert time.monotonic() < deadline, waiting.output()
            time.sleep(0.1)


def test_a_malformed_broker_url_is_one_clear_line_and_a_nonzero_exit(rig: DispatchRig) -> None:
    proc = start_claimer(
        APP, rig.env(OUTBOX_BROKER_URL="redis://:secret@127.0.0.1:notaport/0"), cwd=REPO,
        wait=False,
    )  # fmt: skip
    rig.processes.append(proc)
    assert proc.popen.wait(30) == 2
    output = proc.output()
    assert "OUTBOX_BROKER_URL" in output and "port is not a number" in output, output
    assert "Traceback" not in output and "secret" not in output, output


# -- PostgreSQL down at start ----------------------------------------------------------------


@pytest.mark.slow
def test_claimer_and_worker_wait_for_postgres_at_start_and_stop_promptly_on_sigterm(
    schema: str, redis_url: str
) -> None:
    with PrivatePostgres() as pg:
        rig = DispatchRig(pg.url, schema, redis_url, dict(FAST))
        rig.outbox().migrate()
        with psycopg.connect(pg.url, autocommit=True) as conn:
            dispatch_app.create_tables(conn, schema)
        pg.stop()
        procs: list[OutboxProcess] = []
        try:
            claimer = start_claimer(APP, rig.env(), cwd=REPO, wait=False)
            quitter = start_claimer(APP, rig.env(), cwd=REPO, wait=False)
            worker = start_worker(APP, rig.env(), cwd=REPO, wait=False)
            procs += [claimer, quitter, worker]
            claimer.wait_for("PostgreSQL unreachable", count=3, timeout=20)
            quitter.wait_for("PostgreSQL unreachable", timeout=20)
            worker.wait_for("PostgreSQL unreachable", timeout=30)
            for proc, most in ((quitter, 1.5), (worker, 5.0)):
                asked = time.monotonic()
                assert proc.stop(timeout=10) == 0, proc.output()
                took = time.monotonic() - asked
                assert took < most, f"{proc.argv} took {took:.1f}s to stop"
            assert "claimer started" not in claimer.output()

            pg.start()
            claimer.wait_for("claimer started", timeout=20)
            assert claimer.stop() == 0
        finally:
            for proc in procs:
                proc.close()


# -- a bad message never fails its neighbours ------------------------------------------------


def _tokens_or_none(args: Any) -> list[FenceToken] | None:
    try:
        return FenceToken.from_args(args)
    except ValueError:
        return None


@given(st.lists(st.integers(min_value=-(2**70), max_value=2**70), max_size=8))
def test_only_even_length_lists_of_ids_and_epochs_in_bigint_range_are_pairs(
    values: list[int],
) -> None:
    tokens = _tokens_or_none(values)
    fine = bool(values) and len(values) % 2 == 0 and all(1 <= v <= BIGINT_MAX for v in values)
    assert (tokens is not None) == fine
    if tokens is not None:
        assert list(FenceToken.to_args(tokens)) == values


def test_non_integers_and_bools_are_not_pairs() -> None:
    for args in [("1", 1), (1.0, 1), (True, 1), (1, None), (1, [2]), ()]:
        assert _tokens_or_none(args) is None, args


def test_a_reloaded_worker_pool_comes_back_and_runs_what_waits(rig: DispatchRig) -> None:
    """SIGHUP to the pool's master is Dramatiq's reload: it stops its worker processes and
    starts its own command line again, in the same process, which then runs the actions."""
    rig.claimer()
    worker = rig.worker(processes=1, threads=4)
    first = _enqueue(rig, "before", 4)
    rig.wait_ended(first, timeout=30)
    os.kill(worker.pid, signal.SIGHUP)
    worker.wait_for("Worker process is ready for action.", timeout=60.0, count=2)
    assert worker.popen.poll() is None, worker.output()
    assert "Traceback" not in worker.output(), worker.output()
    after = _enqueue(rig, "after", 4)
    _assert_each_ran_once(rig, first + after)


def test_forged_messages_next_to_legitimate_ones_do_not_hold_them_up(rig: DispatchRig) -> None:
    rig.settings["OUTBOX_ACTIONS_PER_MESSAGE"] = "1"
    outbox = rig.outbox()
    dispatch = install(outbox, broker_from_url(rig.broker_url))
    ids = _enqueue(rig, "legit", 8)

    async def claim() -> list[tuple[int, int]]:
        async with outbox.store() as store:
            claimed = await store.claim({rig.rb: 8}, outbox.settings.lease, take=False)
        return [(c.action.id, c.action.epoch) for c in claimed]

    pairs = asyncio.run(claim())
    assert len(pairs) == 8
    actor = dispatch.actors[rig.rb]
    forged = [("not-an-id", 1), (2**70, 1), (pairs[0][0],), (pairs[1][0], 0), (True, 1)]
    for index, pair in enumerate(pairs):
        dispatch.broker.enqueue(actor.message(*pair))
        if index < len(forged):
            dispatch.broker.enqueue(actor.message(*forged[index]))
    started = time.monotonic()
    worker = rig.worker(threads=8)
    rig.wait_ended(ids, timeout=10)  # the lease is 30 s
    print(f"\n8 legitimate actions next to 5 forged messages: {time.monotonic() - started:.1f}s")
    output = worker.output()
    assert output.count("dropped a malformed message") == 5, output
    assert "not-an-id" not in output and str(2**70) not in output
    _assert_each_ran_once(rig, ids)


async def test_released_claims_are_due_again_unless_taken_or_of_another_epoch(
    make_outbox: Any, schema: str
) -> None:
    outbox = dispatch_app.build(
        make_outbox().settings.require_database_url(), schema, schema.upper()
    )
    outbox.migrate()
    rig = DispatchRig(outbox.settings.require_database_url(), schema, "", {})
    ids = await asyncio.to_thread(_enqueue, rig, "release", 4)
    async with outbox.store() as store:
        claimed = await store.claim({rig.rb: 4}, outbox.settings.lease, take=False)
        pairs = {c.action.id: c.action.epoch for c in claimed}
        taken, stale = ids[0], ids[1]
        assert await store.take_attempt(FenceToken(taken, pairs[taken])) is not None
        asked = [FenceToken(i, e if i != stale else e - 1) for i, e in pairs.items()]
        released = await store.run(release_claims_operation(schema, asked))
        assert sorted(t.action_id for t in released) == sorted(ids[2:])
        assert all(t.epoch == pairs[t.action_id] for t in released)
    with rig.connect() as conn:
        rows = {r["id"]: r for r in rig.actions(conn, ids)}
        db_now = conn.execute("SELECT now() AS now").fetchone()
    assert db_now is not None
    for action_id in ids[2:]:
        row = rows[action_id]
        assert row["state"] == "ADMITTED" and row["lease_until"] is None
        assert row["epoch"] == pairs[action_id], "a release never moves the epoch"
        assert row["available_at"] <= db_now["now"]
    assert {rows[taken]["state"], rows[stale]["state"]} == {"EXECUTING"}


def test_claim_and_push_bounds_must_be_positive_and_come_from_the_environment() -> None:
    from outbox import ConfigurationError, Settings

    settings = Settings.from_env(
        {"OUTBOX_CLAIM_LOCK_TIMEOUT_SECONDS": "3", "OUTBOX_PUSH_TIMEOUT_SECONDS": "0.5"}
    )
    assert settings.claim_lock_timeout == timedelta(seconds=3)
    assert settings.push_timeout == timedelta(seconds=0.5)
    with pytest.raises(ConfigurationError, match="claim_idle_timeout"):
        Settings(claim_idle_timeout=timedelta(0))
