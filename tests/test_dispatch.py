"""Dispatch through Dramatiq, with real processes: claimers and ``dramatiq`` worker pools on real
PostgreSQL, Redis and RabbitMQ. The test app (tests/apps/dispatch_app.py) records every adapter
call and every write in PostgreSQL, so each test reads back what happened across processes."""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections import Counter
from collections.abc import Iterator

import dramatiq
import pika
import psycopg
import pytest
import redis
from dispatch_support import DispatchRig, assert_lanes_held

from outbox import ActionRequest
from outbox.dispatch import broker_from_url, install
from outbox.fence_token import FenceToken
from outbox.status import status
from tests.apps import dispatch_app

pytestmark = pytest.mark.slow

#: Short leases so lease expiry happens within a test; the margin leaves the adapters room.
FAST = {
    "OUTBOX_LEASE_SECONDS": "4",
    "OUTBOX_WRITE_MARGIN_SECONDS": "1",
    "OUTBOX_POLL_INTERVAL_SECONDS": "0.5",
    "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "0.5",
    "OUTBOX_IN_FLIGHT": "64",
    "OUTBOX_BATCH_SIZE": "100",
    "OUTBOX_POOL_SIZE": "8",
}


def _forget_queues(rig: DispatchRig, broker_url: str) -> None:
    """Drops the test's queues from the broker, so no later test sees its messages."""
    names = [*rig.queues, dispatch_app.shop_queue(rig.suffix)]
    if broker_url.startswith("redis"):
        client = redis.Redis.from_url(broker_url)
        for name in names:
            for key in client.scan_iter(match=f"*{name}*"):
                client.delete(key)
        return
    connection = pika.BlockingConnection(pika.URLParameters(broker_url))
    try:
        channel = connection.channel()
        for name in names:
            for queue in (name, f"{name}.DQ", f"{name}.XQ"):
                channel.queue_delete(queue)
    finally:
        connection.close()


#: Server connections another test's processes may still hold when a test starts its own (the
#: backends of processes an earlier test killed exit a moment after them); max_connections is 100.
SPARE_CONNECTIONS = 40


def _wait_for_spare_connections(
    database_url: str, timeout: float = 15.0, others: int = SPARE_CONNECTIONS
) -> None:
    """Until fewer than ``others`` other sessions are open (or ``timeout``): a test that starts
    a claimer and a pool of worker processes needs about 40 of its own (``others`` lower for a
    test whose pool needs more)."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'"
            ).fetchone()
            if row is None or row[0] < others:
                return
            time.sleep(0.2)


def _rig(database_url: str, schema: str, broker_url: str) -> Iterator[DispatchRig]:
    _wait_for_spare_connections(database_url)
    rig = DispatchRig(database_url, schema, broker_url, dict(FAST))
    outbox = rig.outbox()
    outbox.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        dispatch_app.create_tables(conn, schema)
    try:
        yield rig
    finally:
        list(rig.stop_all())
        for proc in rig.processes:
            proc.log_path.unlink(missing_ok=True)
        _forget_queues(rig, broker_url)


@pytest.fixture
def rig(database_url: str, schema: str, redis_url: str) -> Iterator[DispatchRig]:
    yield from _rig(database_url, schema, redis_url)


@pytest.fixture(params=["redis", "rabbitmq"])
def any_rig(
    request: pytest.FixtureRequest,
    database_url: str,
    schema: str,
    redis_url: str,
    rabbitmq_url: str,
) -> Iterator[DispatchRig]:
    yield from _rig(database_url, schema, redis_url if request.param == "redis" else rabbitmq_url)


def test_end_to_end_2000_actions_over_50_lanes_each_done_once_in_lane_order(
    any_rig: DispatchRig,
) -> None:
    rig = any_rig
    worker = rig.worker(threads=8)
    claimer = rig.claimer()
    started = time.monotonic()
    ids = rig.enqueue(rig.rb, lanes=50, per_lane=40)
    rows = rig.wait_ended(ids, timeout=90)
    elapsed = time.monotonic() - started
    print(f"\n{len(ids)} actions over 50 lanes via {rig.broker_url.split(':')[0]}: {elapsed:.1f}s")

    assert Counter(r["state"] for r in rows) == {"DONE": 2000}
    assert all(r["attempt"] == 1 for r in rows), "an action ran more than one attempt"
    effects = Counter(e["action_id"] for e in rig.effects())
    assert set(effects) == set(ids) and set(effects.values()) == {1}
    calls = rig.calls()
    assert len(calls) == 2000
    assert_lanes_held(calls)
    assert claimer.stop() == 0, claimer.output()
    assert "claimer stopped" in claimer.output()
    assert worker.stop() == 0


@pytest.mark.parametrize("loop", ["auto", "asyncio"])
def test_the_claimer_and_the_workers_run_on_the_event_loop_the_settings_choose(
    rig: DispatchRig, loop: str
) -> None:
    """``auto`` is uvloop (installed with the outbox); ``asyncio`` is asyncio's own loop. Either
    runs every action once."""
    expected = "uvloop" if loop == "auto" else "asyncio"
    worker = rig.worker(processes=2, threads=2, OUTBOX_EVENT_LOOP=loop)
    claimer = rig.claimer(OUTBOX_EVENT_LOOP=loop)
    ids = rig.enqueue(rig.rb, lanes=10, per_lane=3)
    rows = rig.wait_ended(ids, timeout=60)
    assert Counter(r["state"] for r in rows) == {"DONE": 30}
    assert set(Counter(e["action_id"] for e in rig.effects()).values()) == {1}
    assert claimer.stop() == 0
    assert worker.stop() == 0
    started = [line for line in worker.output().splitlines() if "runtime started" in line]
    assert len(started) == 2 and all(f"({expected})" in line for line in started), started
    assert any(
        "claimer started" in line and line.rstrip().endswith(f", {expected}")
        for line in claimer.output().splitlines()
    ), claimer.output()


def test_a_lane_runs_through_its_workers_hand_offs_and_the_claimer_claims_each_runs_first(
    rig: DispatchRig,
) -> None:
    """Twelve actions of one lane, a hand-off budget of three: each message's worker runs the
    lane's next three itself (claimed in its finishes), so the claimer claims three of the
    twelve; each runs once, in lane order, one at a time."""
    worker = rig.worker(threads=2, OUTBOX_HAND_OFF="3")
    claimer = rig.claimer(OUTBOX_HAND_OFF="3")
    ids = rig.enqueue(rig.rb, lanes=1, per_lane=12)
    rows = rig.wait_ended(ids, timeout=60)

    assert Counter(r["state"] for r in rows) == {"DONE": 12}
    assert all(r["attempt"] == 1 for r in rows), "an action ran more than one attempt"
    calls = rig.calls()
    assert sorted(c["action_id"] for c in calls) == ids
    assert_lanes_held(calls)
    assert claimer.stop() == 0, claimer.output()
    assert re.search(r"claimer stopped: .*'claimed': 3,", claimer.output()), claimer.output()
    assert worker.stop() == 0


def test_worker_killed_mid_action_read_back_runs_again_and_at_most_once_ends_uncertain(
    rig: DispatchRig,
) -> None:
    first = rig.worker(threads=4)
    rig.claimer()
    hang = {"hang_after_write_attempt": 1}
    [rb_id] = rig.enqueue(rig.rb, lanes=1, per_lane=1, payload=hang)
    [amo_id] = rig.enqueue(rig.amo, lanes=1, per_lane=1, payload=hang)
    rig.wait_rows("dispatch_effect", 2)  # both wrote, and both now hang inside the provider
    first.kill()
    killed_at = time.monotonic()
    rig.worker(threads=4)

    rb, amo = rig.wait_ended([rb_id, amo_id], timeout=30)
    # The read-back kind ran again once its lease ran out, found its write and did not repeat it.
    assert (rb["state"], rb["attempt"]) == ("DONE", 2)
    # The at-most-once kind is never called again: it ends UNCERTAIN when its lease is lost.
    assert (amo["state"], amo["stop_reason"], amo["attempt"]) == (
        "UNCERTAIN",
        "LEASE_LOST_AFTER_WRITE",
        1,
    )
    time.sleep(1.0)  # a late reclaim or a redelivery would show up as one more call
    calls = Counter(c["action_id"] for c in rig.calls())
    assert calls == {rb_id: 2, amo_id: 1}
    assert Counter(e["action_id"] for e in rig.effects()) == {rb_id: 1, amo_id: 1}
    with rig.connect() as conn:
        waited = conn.execute(
            f"SELECT extract(epoch FROM max(started_at) - min(started_at)) AS s "
            f'FROM "{rig.schema}".dispatch_call WHERE action_id = %s',
            (rb_id,),
        ).fetchone()
    assert waited is not None and waited["s"] >= 3.0, "the second attempt did not wait the lease"
    assert time.monotonic() - killed_at < 20


def test_claimer_killed_between_commit_and_push_action_reclaimed_after_lease_runs_once(
    rig: DispatchRig,
) -> None:
    stalled = rig.claimer(DISPATCH_APP_STALL_PUSH="1")
    [action_id] = rig.enqueue(rig.rb, lanes=1, per_lane=1)
    rig.wait_rows("dispatch_stall", 1)  # the claim committed; the push never happens
    with rig.connect() as conn:
        [row] = rig.actions(conn, [action_id])
    assert (row["state"], row["epoch"]) == ("EXECUTING", 1)
    stalled.kill()
    client = redis.Redis.from_url(rig.broker_url)
    assert all(client.llen(f"dramatiq:{q}") == 0 for q in rig.queues), "a message was pushed"

    rig.worker(threads=2)
    rig.claimer()
    [row] = rig.wait_ended([action_id], timeout=30)
    # The lost claim cost no attempt: only the worker's take of the reclaim counts one.
    assert (row["state"], row["attempt"], row["epoch"]) == ("DONE", 1, 2)
    calls = rig.calls()
    assert [(c["action_id"], c["epoch"]) for c in calls] == [(action_id, 2)]
    assert len(rig.effects()) == 1


def test_same_message_delivered_twice_second_is_abandoned_and_effect_happens_once(
    rig: DispatchRig,
) -> None:
    worker = rig.worker(threads=4)
    [action_id] = rig.enqueue(rig.rb, lanes=1, per_lane=1, payload={"sleep": 0.5})
    outbox = rig.outbox()
    dispatch = install(outbox, broker_from_url(rig.broker_url))

    async def claim() -> int:
        async with outbox.store() as store:
            [claimed] = await store.claim({rig.rb: 1}, outbox.settings.lease, take=False)
            return claimed.action.epoch

    epoch = asyncio.run(claim())
    # Two deliveries of one message at once (a broker redelivery while the first still runs).
    dispatch.push(rig.rb, FenceToken(action_id, epoch))
    dispatch.push(rig.rb, FenceToken(action_id, epoch))
    [row] = rig.wait_ended([action_id], timeout=20)
    # And one more after the action ended.
    dispatch.push(rig.rb, FenceToken(action_id, epoch))
    deadline = time.monotonic() + 10
    while worker.output().count("abandoned message for action") < 2:
        if time.monotonic() > deadline:
            break
        time.sleep(0.05)

    assert row["state"] == "DONE"
    assert len(rig.calls()) == 1, "the adapter ran for a second delivery"
    assert len(rig.effects()) == 1
    assert worker.output().count(f"abandoned message for action {action_id} epoch {epoch}") == 2


def test_one_message_of_several_pairs_runs_each_once_and_drops_its_twin_and_stale_pairs(
    rig: DispatchRig,
) -> None:
    worker = rig.worker(threads=2)
    first, stale, last = rig.enqueue(rig.rb, lanes=3, per_lane=1, payload={"sleep": 0.3})
    outbox = rig.outbox()
    dispatch = install(outbox, broker_from_url(rig.broker_url))

    async def claim() -> dict[int, int]:
        async with outbox.store() as store:
            claimed = await store.claim({rig.rb: 3}, outbox.settings.lease, take=False)
            epochs = {c.action.id: c.action.epoch for c in claimed}
            # The stale action's lease ends and it is reclaimed: its first epoch no longer holds.
            async with store.connection() as conn:
                await conn.execute(
                    f'UPDATE "{rig.schema}".agent_action SET lease_until = now() WHERE id = %s',
                    (stale,),
                )
            [again] = await store.claim({rig.rb: 1}, outbox.settings.lease, take=False)
            assert again.action.id == stale and again.action.epoch == epochs[stale] + 1
            return epochs

    epochs = asyncio.run(claim())
    tokens = [
        FenceToken(first, epochs[first]),
        FenceToken(first, epochs[first]),  # a twin inside the message
        FenceToken(stale, epochs[stale]),  # an epoch that no longer holds
        FenceToken(last, epochs[last]),
    ]
    dispatch.broker.enqueue(dispatch.message(rig.rb, tokens))
    rows = rig.wait_ended([first, last], timeout=20)

    assert [r["state"] for r in rows] == ["DONE", "DONE"]
    assert sorted(c["action_id"] for c in rig.calls()) == [first, last]
    assert len(rig.effects()) == 2
    deadline = time.monotonic() + 10
    while worker.output().count("abandoned message for action") < 2:
        assert time.monotonic() < deadline, worker.output()
        time.sleep(0.05)
    with psycopg.connect(rig.database_url) as conn:
        state = conn.execute(
            f'SELECT state FROM "{rig.schema}".agent_action WHERE id = %s', (stale,)
        ).fetchone()
    assert state == ("EXECUTING",), "the stale pair must leave its action to its lease"


def test_two_claimers_two_workers_5000_actions_each_end_once_without_lane_overlap(
    rig: DispatchRig,
) -> None:
    rig.worker(threads=8)
    rig.worker(threads=8)
    rig.claimer()
    rig.claimer()
    started = time.monotonic()
    ids = rig.enqueue(rig.rb, lanes=100, per_lane=50)
    rows = rig.wait_ended(ids, timeout=120)
    elapsed = time.monotonic() - started
    print(f"\n5000 actions, 100 lanes, 2 claimers, 2 workers: {elapsed:.1f}s")

    assert Counter(r["state"] for r in rows) == {"DONE": 5000}
    effects = Counter(e["action_id"] for e in rig.effects())
    assert set(effects) == set(ids) and set(effects.values()) == {1}
    calls = rig.calls()
    assert Counter(c["action_id"] for c in calls) == Counter(ids), "an action ran twice"
    assert len({c["pid"] for c in calls}) == 2, "both worker processes should have worked"
    assert_lanes_held(calls)


def test_burst_larger_than_in_flight_bound_no_lease_expires_while_waiting_in_broker(
    rig: DispatchRig,
) -> None:
    # 2 threads x 0.4 s per action: 5 actions a second. 40 actions would wait 8 s in the broker
    # if all were claimed at once -- twice the 4 s lease. The bound of 4 keeps the wait < 1 s.
    rig.settings["OUTBOX_IN_FLIGHT"] = "4"
    rig.worker(threads=2)
    rig.claimer()
    ids = rig.enqueue(rig.rb, lanes=40, per_lane=1, payload={"sleep": 0.4})
    peak = 0
    deadline = time.monotonic() + 40
    with rig.connect() as conn:
        while time.monotonic() < deadline:
            n = conn.execute(
                f"SELECT count(*) AS n FROM \"{rig.schema}\".agent_action WHERE state = 'EXECUTING'"
            ).fetchone()
            peak = max(peak, n["n"] if n else 0)
            if all(r["state"] == "DONE" for r in rig.actions(conn, ids)):
                break
            time.sleep(0.02)
    rows = rig.wait_ended(ids, timeout=1)
    assert peak <= 4, f"{peak} actions in flight, bound 4"
    assert all((r["state"], r["attempt"]) == ("DONE", 1) for r in rows), "a lease ran out"
    calls = rig.calls()
    assert len(calls) == 40
    # Every attempt started with most of its lease left: it did not wait long in the broker.
    assert min(c["lease_left"] for c in calls) > 2.0


def test_existing_dramatiq_shop_runs_its_actors_and_the_outbox_with_one_command(
    rig: DispatchRig,
) -> None:
    from dispatch_support import REPO

    from outbox.dispatch.processes import OutboxProcess

    env = rig.env(DISPATCH_APP_OWN_BROKER="1")
    # The shop's own command: its broker module, all queues, its own middleware.
    shop = OutboxProcess(
        [
            sys.executable,
            "-m",
            "dramatiq",
            "tests.apps.dispatch_app:shop_broker",
            "--processes",
            "1",
            "--threads",
            "2",
        ],
        env,
        REPO,
    )
    rig.processes.append(shop)
    shop.wait_for("Worker process is ready for action.", timeout=60)
    rig.claimer(DISPATCH_APP_OWN_BROKER="1")
    ids = rig.enqueue(rig.rb, lanes=3, per_lane=2) + rig.enqueue(rig.amo, lanes=2, per_lane=1)

    # The shop's web process sends to its own actor, as it always did.
    broker = broker_from_url(rig.broker_url)
    shop_queue = dispatch_app.shop_queue(rig.suffix)
    broker.declare_queue(shop_queue)
    broker.enqueue(
        dramatiq.Message(
            queue_name=shop_queue,
            actor_name=f"shop_note_{rig.suffix.lower()}",
            args=("hello",),
            kwargs={},
            options={},
        )
    )

    rows = rig.wait_ended(ids, timeout=30)
    assert {r["state"] for r in rows} == {"DONE"}
    rig.wait_rows("dispatch_shop", 1)
    shop.stop()
    log = shop.output()
    assert "outbox worker runtime started" in log, "the outbox actors did not join the shop"


# -- outages cost nothing ----------------------------------------------------------------------


def test_a_worker_outage_of_several_leases_spends_no_attempt_and_ends_nothing(
    rig: DispatchRig,
) -> None:
    short = {"OUTBOX_LEASE_SECONDS": "2", "OUTBOX_WRITE_MARGIN_SECONDS": "0.5"}
    rig.settings.update(short)
    ids = rig.enqueue(rig.rb, lanes=30, per_lane=1)
    claimer = rig.claimer()
    time.sleep(5 * 2.0 + 1.0)  # five leases without a single worker
    with rig.connect() as conn:
        rows = rig.actions(conn, ids)
    assert [r["state"] for r in rows if r["ended_at"]] == [], "an action ended with no worker"
    assert {r["attempt"] for r in rows} == {0}, "a claim nobody took spent an attempt"
    client = redis.Redis.from_url(rig.broker_url)
    queued = sum(client.llen(f"dramatiq:{q}") for q in rig.queues)
    # The first claim pushed 30 actions; after that, one probe at a time, never a lease's worth.
    assert queued <= 30 // 8 + 1 + 6, queued
    assert "were not taken by any worker within their lease" in claimer.output()
    with rig.connect() as conn:
        report = status(conn, schema=rig.schema)
    assert report.backlog[rig.rb]["unconsumed"] > 0

    rig.worker(threads=8)
    rows = rig.wait_ended(ids, timeout=30)
    assert {(r["state"], r["attempt"]) for r in rows} == {("DONE", 1)}
    assert Counter(c["action_id"] for c in rig.calls()) == dict.fromkeys(ids, 1)
    deadline = time.monotonic() + 10
    while "claiming resumes" not in claimer.output() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert "claiming resumes" in claimer.output()


def _peak_rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status_file:
        for line in status_file:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


@pytest.mark.slow
def test_the_claimer_never_loads_the_payloads_it_claims(
    rig: DispatchRig, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A deployment that raised the payload limit far past its 64 KiB default.
    monkeypatch.setenv("OUTBOX_MAX_PAYLOAD_BYTES", "8000000")
    rig.settings["OUTBOX_MAX_PAYLOAD_BYTES"] = "8000000"
    ids = rig.enqueue(rig.rb, lanes=24, per_lane=1, payload={"blob": "x" * 4_000_000})
    claimer = rig.claimer()
    deadline = time.monotonic() + 30
    while True:
        with rig.connect() as conn:
            rows = rig.actions(conn, ids)
        if all(r["state"] == "EXECUTING" for r in rows) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert all(r["state"] == "EXECUTING" for r in rows)
    # 24 payloads of 4 MB are 96 MB; a claimer that read them would hold at least that.
    assert _peak_rss_mib(claimer.popen.pid) < 90


def test_newsletters_enqueued_under_a_busy_pool_never_fail_the_callers_transaction(
    rig: DispatchRig,
) -> None:
    """One transaction a newsletter: an action for each of 1,000 people, a lane each, while a
    claimer and a worker pool finish the previous newsletter."""
    # No process is killed here: a long lease keeps a loaded machine's slow attempt from
    # ending UNCERTAIN, which is not what this test is about.
    rig.settings.update(
        {
            "OUTBOX_IN_FLIGHT": "512",
            "OUTBOX_LEASE_SECONDS": "60",
            "OUTBOX_WRITE_MARGIN_SECONDS": "20",
        }
    )
    # This claimer, two worker processes of 16 threads and the enqueuer open about 70 sessions
    # at their busiest: what an earlier test's killed processes still hold must have gone first
    # (the fixture waited only for room for 40).
    _wait_for_spare_connections(rig.database_url, others=25)
    rig.claimer()
    rig.worker(processes=2, threads=16)
    outbox = rig.outbox()
    ids: list[int] = []
    for letter in range(6):
        batch = [
            ActionRequest(
                kind=rig.rb,
                workspace_id="w1",
                lane_key=f"person-{person}",
                idempotency_key=f"letter-{letter}-{person}",
            )
            for person in range(1000)
        ]
        with psycopg.connect(rig.database_url) as conn:
            if letter % 2:
                ids.extend(a.id for a in outbox.enqueue_many(conn, batch))
            else:
                ids.extend(outbox.enqueue(conn, item).id for item in batch)
    rows = rig.wait_ended(ids, timeout=120)
    assert {r["state"] for r in rows} == {"DONE"}
    assert Counter(c["action_id"] for c in rig.calls()) == dict.fromkeys(ids, 1)
    assert_lanes_held(rig.calls())


OUTAGE_SETTINGS = {
    "held": {"OUTBOX_OUTAGE_THRESHOLD": "5"},
    "probed": {"OUTBOX_OUTAGE_THRESHOLD": "5", "OUTBOX_OUTAGE_HOLD_SECONDS": "0.5"},
    "ridden out": {"OUTBOX_OUTAGE_THRESHOLD": "5", "OUTBOX_OUTAGE_HOLD_SECONDS": "0"},
    "off": {"OUTBOX_OUTAGE_THRESHOLD": "0"},
}


@pytest.mark.parametrize("outage", sorted(OUTAGE_SETTINGS))
def test_worker_processes_ride_out_a_provider_outage_longer_than_the_retry_budget(
    rig: DispatchRig, outage: str
):
    """Eight at-most-once actions meet a provider that answers Retry for 3 s, where their three
    attempts back off 0.05 s x (1 + 2) x 0.5..1 (at most 0.15 s) in all. Through a real claimer
    and two worker processes: with the outage on, every one is written exactly once after the
    provider is back; with it off, every one fails and none is written. Without a hold, each
    rides the outage out on its last attempt, given back while the provider is down, and calls
    the provider once a backoff; with the hold (5 s at the defaults, longer than the outage)
    the claimer stops claiming the kind once it counts as down, and the provider takes no call
    an action more than its attempts allow before the hold; with holds of 0.5 s, 1 s and 2 s
    within the outage, one action probes it after each, and each probe's retry holds the kind
    again."""
    with rig.connect() as conn:
        conn.execute(f'INSERT INTO "{rig.schema}".dispatch_down DEFAULT VALUES')
    outbox = rig.outbox()
    with psycopg.connect(rig.database_url) as conn:
        ids = [
            outbox.enqueue(
                conn,
                ActionRequest(
                    rig.amo, lane_key=f"down-{i}", idempotency_key=f"down-{i}",
                    workspace_id="w1", payload={"retry_while_down": True}, max_attempts=3,
                ),
            ).id
            for i in range(8)
        ]  # fmt: skip
    env = {"OUTBOX_RETRY_BASE_SECONDS": "0.05", **OUTAGE_SETTINGS[outage]}
    rig.claimer(**env)
    rig.worker(processes=2, threads=4, **env)
    time.sleep(3.0)
    with rig.connect() as conn:
        back = conn.execute(
            f'DELETE FROM "{rig.schema}".dispatch_down RETURNING clock_timestamp() AS back'
        ).fetchone()["back"]
    rows = rig.wait_ended(ids, timeout=60)
    effects = Counter(e["action_id"] for e in rig.effects())
    with rig.connect() as conn:
        calls_while_down = conn.execute(
            f'SELECT count(*) AS n FROM "{rig.schema}".dispatch_call WHERE started_at < %s',
            (back,),
        ).fetchone()["n"]
    if outage == "off":
        assert [(r["state"], r["stop_reason"]) for r in rows] == [
            ("FAILED", "ATTEMPTS_EXHAUSTED")
        ] * 8, rig.logs()
        assert effects == Counter()
        return
    assert [r["state"] for r in rows] == ["DONE"] * 8, rig.logs()
    assert effects == Counter(ids)
    if outage == "ridden out":
        # Each rode out the outage on its last attempt, given back while the provider was down.
        assert all(r["attempt"] == 3 for r in rows), [r["attempt"] for r in rows]
        assert calls_while_down > 8 * 3, calls_while_down
    elif outage == "held":
        assert all(r["attempt"] <= 3 for r in rows), [r["attempt"] for r in rows]
        assert calls_while_down <= 8 * 3, calls_while_down
    else:
        # The first attempts, and a probe after each hold (about 0.5, 1.5 and 3.5 s in).
        assert 8 < calls_while_down <= 8 * 3 + 4, calls_while_down
