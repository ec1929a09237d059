"""Dispatch through Celery, with real processes: claimers and ``celery worker`` pools on real
PostgreSQL, Redis and RabbitMQ, the same guarantees as the Dramatiq path (tests/test_dispatch.py):
each epoch runs at most once whatever Celery delivers twice, a worker killed mid-write, a
claimer killed between its commit and its push, the in-flight bound, and 2 claimers with 2
Celery workers on thousands of actions over lanes."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Iterator

import pika
import psycopg
import pytest
import redis
from dispatch_support import REPO, DispatchRig, assert_lanes_held

from outbox.dispatch.celery_fabric import CeleryDispatch, install
from outbox.dispatch.processes import OutboxProcess, start_celery_worker
from outbox.fence_token import FenceToken
from tests.apps import dispatch_app

pytestmark = pytest.mark.slow

#: Short leases so lease expiry happens within a test; the margin leaves the adapters room.
FAST = {
    "OUTBOX_FABRIC": "celery",
    "OUTBOX_LEASE_SECONDS": "4",
    "OUTBOX_WRITE_MARGIN_SECONDS": "1",
    "OUTBOX_POLL_INTERVAL_SECONDS": "0.5",
    "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "0.5",
    "OUTBOX_IN_FLIGHT": "64",
    "OUTBOX_BATCH_SIZE": "100",
    "OUTBOX_POOL_SIZE": "8",
}
APP = "tests.apps.dispatch_app:make_outbox"


class CeleryRig(DispatchRig):
    """``DispatchRig`` whose workers are ``celery worker`` processes."""

    def celery_worker(
        self,
        pool: str = "threads",
        concurrency: int = 4,
        celery_app: str | None = None,
        queues: list[str] | None = None,
        **extra: str,
    ) -> OutboxProcess:
        env = {**self.env(**extra), "OUTBOX_APP": APP}
        options = {"celery_app": celery_app} if celery_app else {}
        proc = start_celery_worker(
            env,
            queues=queues or self.queues,
            pool=pool,
            concurrency=concurrency,
            cwd=REPO,
            wait=False,
            **options,
        )
        self.processes.append(proc)
        proc.wait_for(" ready.", timeout=60)
        return proc

    def dispatch(self) -> CeleryDispatch:
        """The fabric as a claimer sees it, from the test process."""
        outbox = self.outbox()
        return install(outbox, _app(self.broker_url))


def _app(broker_url: str):  # type: ignore[no-untyped-def]
    from outbox.dispatch.celery_fabric import outbox_app

    return outbox_app(broker_url)


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
            channel.queue_delete(name)
            channel.exchange_delete(name)
    finally:
        connection.close()


def _rig(database_url: str, schema: str, broker_url: str) -> Iterator[CeleryRig]:
    rig = CeleryRig(database_url, schema, broker_url, dict(FAST))
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
def rig(database_url: str, schema: str, redis_url: str) -> Iterator[CeleryRig]:
    yield from _rig(database_url, schema, redis_url)


@pytest.fixture(params=["redis", "rabbitmq"])
def any_rig(
    request: pytest.FixtureRequest,
    database_url: str,
    schema: str,
    redis_url: str,
    rabbitmq_url: str,
) -> Iterator[CeleryRig]:
    yield from _rig(database_url, schema, redis_url if request.param == "redis" else rabbitmq_url)


def _queued(rig: DispatchRig, queue: str) -> int:
    """Messages waiting on ``queue`` (0 if it was never declared)."""
    if rig.broker_url.startswith("redis"):
        return int(redis.Redis.from_url(rig.broker_url).llen(queue))
    connection = pika.BlockingConnection(pika.URLParameters(rig.broker_url))
    try:
        declared = connection.channel().queue_declare(queue, passive=True)
        return int(declared.method.message_count)
    except pika.exceptions.ChannelClosedByBroker:
        return 0  # NOT_FOUND: nothing was ever published to it
    finally:
        if connection.is_open:
            connection.close()


def _claim(rig: DispatchRig, kind: str, n: int) -> list[FenceToken]:
    """Claims ``n`` actions of ``kind`` as a claimer would (nothing pushed)."""
    outbox = rig.outbox()

    async def claim() -> list[FenceToken]:
        async with outbox.store() as store:
            claimed = await store.claim({kind: n}, outbox.settings.lease, take=False)
            return [c.action.token for c in claimed]

    return asyncio.run(claim())


def _wait_for_count(proc: OutboxProcess, text: str, count: int, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while proc.output().count(text) < count:
        assert time.monotonic() < deadline, proc.output()[-4000:]
        time.sleep(0.05)


def test_two_claimers_two_celery_workers_2000_actions_over_lanes_each_once_in_lane_order(
    any_rig: CeleryRig,
) -> None:
    rig = any_rig
    # A lease long enough that a loaded machine's slow statement never ends an attempt: this
    # test is about each action once, in lane order, without overlap.
    rig.settings.update(OUTBOX_LEASE_SECONDS="20", OUTBOX_WRITE_MARGIN_SECONDS="5")
    rig.celery_worker(pool="threads", concurrency=8)
    rig.celery_worker(pool="prefork", concurrency=2)
    rig.claimer()
    rig.claimer()
    started = time.monotonic()
    ids = rig.enqueue(rig.rb, lanes=50, per_lane=40)
    rows = rig.wait_ended(ids, timeout=150)
    elapsed = time.monotonic() - started
    print(
        f"\n2000 actions, 50 lanes, 2 claimers, 2 Celery workers via {rig.broker_url[:5]}: "
        f"{elapsed:.1f}s"
    )

    assert Counter(r["state"] for r in rows) == {"DONE": 2000}
    assert all(r["attempt"] == 1 for r in rows), "an action ran more than one attempt"
    effects = Counter(e["action_id"] for e in rig.effects())
    assert set(effects) == set(ids) and set(effects.values()) == {1}
    calls = rig.calls()
    assert Counter(c["action_id"] for c in calls) == Counter(ids), "an action ran twice"
    assert len({c["pid"] for c in calls}) >= 2, "both workers should have worked"
    assert_lanes_held(calls)
    for proc in rig.processes:  # one SIGTERM each: Celery's warm shutdown, then exit 0
        assert proc.stop() == 0, rig.logs()


def test_same_message_delivered_twice_second_is_abandoned_and_effect_happens_once(
    any_rig: CeleryRig,
) -> None:
    rig = any_rig
    worker = rig.celery_worker(concurrency=4)
    [action_id] = rig.enqueue(rig.rb, lanes=1, per_lane=1, payload={"sleep": 0.5})
    [token] = _claim(rig, rig.rb, 1)
    dispatch = rig.dispatch()
    # Two deliveries of one message at once (a visibility-timeout redelivery on Redis, a lost
    # channel's on RabbitMQ, while the first still runs).
    dispatch.push(rig.rb, token)
    dispatch.push(rig.rb, token)
    [row] = rig.wait_ended([action_id], timeout=20)
    # And one more after the action ended.
    dispatch.push(rig.rb, token)
    _wait_for_count(worker, "abandoned message for action", 2)

    assert row["state"] == "DONE"
    assert len(rig.calls()) == 1, "the adapter ran for a second delivery"
    assert len(rig.effects()) == 1
    text = f"abandoned message for action {action_id} epoch {token.epoch}"
    assert worker.output().count(text) == 2


def test_one_message_of_several_pairs_drops_its_twin_and_a_malformed_message_by_name(
    rig: CeleryRig,
) -> None:
    worker = rig.celery_worker(concurrency=2)
    first, last = rig.enqueue(rig.rb, lanes=2, per_lane=1, payload={"sleep": 0.2})
    tokens = _claim(rig, rig.rb, 2)
    dispatch = rig.dispatch()
    task = dispatch.tasks[rig.rb]
    queue = rig.outbox().kinds[rig.rb].queue_name
    # Someone else's message on an outbox queue: dropped before it reaches a statement.
    task.apply_async(args=["1", 2], queue=queue)
    task.apply_async(args=[True, 1], queue=queue)
    dispatch.push_batch(rig.rb, [tokens[0], tokens[0], tokens[1]])
    rows = rig.wait_ended([first, last], timeout=20)

    assert [r["state"] for r in rows] == ["DONE", "DONE"]
    assert sorted(c["action_id"] for c in rig.calls()) == [first, last]
    _wait_for_count(worker, "abandoned message for action", 1)
    _wait_for_count(worker, "dropped a malformed message", 2)


def test_celery_worker_process_killed_mid_write_redelivery_dropped_read_back_runs_again(
    rig: CeleryRig,
) -> None:
    # A prefork pool: the outbox's loop and pool start in each child after the fork.
    worker = rig.celery_worker(pool="prefork", concurrency=2)
    rig.claimer()
    hang = {"hang_after_write_attempt": 1}
    [rb_id] = rig.enqueue(rig.rb, lanes=1, per_lane=1, payload=hang)
    [amo_id] = rig.enqueue(rig.amo, lanes=1, per_lane=1, payload=hang)
    rig.wait_rows("dispatch_effect", 2)  # both wrote, and both now hang inside the provider
    children = {c["pid"] for c in rig.calls()}
    assert worker.pid not in children
    for pid in children:
        os.kill(pid, signal.SIGKILL)  # the child dies mid-write; its master lives on
    killed_at = time.monotonic()

    rb, amo = rig.wait_ended([rb_id, amo_id], timeout=40)
    # reject_on_worker_lost handed the messages back: their redeliveries found the epochs
    # taken and were dropped; the read-back kind ran again only once its lease ran out.
    _wait_for_count(worker, "abandoned message for action", 2)
    assert "WorkerLostError" in worker.output()
    assert (rb["state"], rb["attempt"], rb["epoch"]) == ("DONE", 2, 2)
    assert (amo["state"], amo["stop_reason"], amo["attempt"]) == (
        "UNCERTAIN",
        "LEASE_LOST_AFTER_WRITE",
        1,
    )
    time.sleep(1.0)  # a late reclaim or a redelivery would show up as one more call
    calls = Counter(c["action_id"] for c in rig.calls())
    assert calls == {rb_id: 2, amo_id: 1}
    assert Counter(e["action_id"] for e in rig.effects()) == {rb_id: 1, amo_id: 1}
    assert time.monotonic() - killed_at < 30


def test_whole_celery_worker_killed_mid_write_next_worker_finishes_at_most_once(
    any_rig: CeleryRig,
) -> None:
    rig = any_rig
    first = rig.celery_worker(pool="threads", concurrency=4)
    rig.claimer()
    hang = {"hang_after_write_attempt": 1}
    [rb_id] = rig.enqueue(rig.rb, lanes=1, per_lane=1, payload=hang)
    [amo_id] = rig.enqueue(rig.amo, lanes=1, per_lane=1, payload=hang)
    rig.wait_rows("dispatch_effect", 2)
    first.kill()  # master and all: the broker redelivers its unacknowledged messages
    rig.celery_worker(pool="threads", concurrency=4)

    rb, amo = rig.wait_ended([rb_id, amo_id], timeout=40)
    assert (rb["state"], rb["attempt"]) == ("DONE", 2)
    assert (amo["state"], amo["stop_reason"]) == ("UNCERTAIN", "LEASE_LOST_AFTER_WRITE")
    time.sleep(1.0)
    assert Counter(c["action_id"] for c in rig.calls()) == {rb_id: 2, amo_id: 1}
    assert Counter(e["action_id"] for e in rig.effects()) == {rb_id: 1, amo_id: 1}


def test_claimer_killed_between_commit_and_push_action_reclaimed_after_lease_runs_once(
    any_rig: CeleryRig,
) -> None:
    rig = any_rig
    stalled = rig.claimer(DISPATCH_APP_STALL_PUSH="1")
    [action_id] = rig.enqueue(rig.rb, lanes=1, per_lane=1)
    rig.wait_rows("dispatch_stall", 1)  # the claim committed; the publish never happens
    with rig.connect() as conn:
        [row] = rig.actions(conn, [action_id])
    assert (row["state"], row["epoch"]) == ("EXECUTING", 1)
    stalled.kill()
    assert all(_queued(rig, q) == 0 for q in rig.queues), "a message was pushed"

    rig.celery_worker(concurrency=2)
    rig.claimer()
    [row] = rig.wait_ended([action_id], timeout=30)
    # The lost claim cost no attempt: only the worker's take of the reclaim counts one.
    assert (row["state"], row["attempt"], row["epoch"]) == ("DONE", 1, 2)
    assert [(c["action_id"], c["epoch"]) for c in rig.calls()] == [(action_id, 2)]
    assert len(rig.effects()) == 1


def test_burst_larger_than_in_flight_bound_no_lease_expires_while_waiting_in_the_queue(
    any_rig: CeleryRig,
) -> None:
    rig = any_rig
    # 2 threads x 0.4 s an action, one action a message: 5 actions a second. 40 actions would
    # wait 8 s in the queue if all were claimed at once -- twice the 4 s lease.
    rig.settings["OUTBOX_IN_FLIGHT"] = "4"
    rig.settings["OUTBOX_ACTIONS_PER_MESSAGE"] = "1"
    rig.celery_worker(concurrency=2)
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
    assert min(c["lease_left"] for c in calls) > 2.0


def test_existing_celery_shop_adds_the_outbox_in_one_line_and_one_worker_runs_both(
    rig: CeleryRig,
) -> None:
    shop_queue = dispatch_app.shop_queue(rig.suffix)
    shop = rig.celery_worker(
        celery_app="tests.apps.celery_shop:app", queues=[shop_queue, *rig.queues]
    )
    rig.claimer(OUTBOX_CELERY_APP="tests.apps.celery_shop:app")
    ids = rig.enqueue(rig.rb, lanes=3, per_lane=2) + rig.enqueue(rig.amo, lanes=2, per_lane=1)
    # The shop's web process sends to its own task, as it always did.
    from celery import Celery

    web = Celery("shop", broker=rig.broker_url, set_as_current=False)
    web.send_task(f"shop_note_{rig.suffix.lower()}", args=["hello"], queue=shop_queue)

    rows = rig.wait_ended(ids, timeout=30)
    assert {r["state"] for r in rows} == {"DONE"}
    rig.wait_rows("dispatch_shop", 1)
    assert "outbox worker runtime started" in shop.output()


def test_outbox_worker_with_fabric_celery_runs_celery_worker_with_json_logs(
    rig: CeleryRig,
) -> None:
    import json
    import sys

    env = {**rig.env(), "OUTBOX_LOG_FORMAT": "json"}
    argv = [sys.executable, "-m", "outbox", "worker", APP, "--fabric", "celery", "--threads", "2"]
    worker = OutboxProcess(argv, env, cwd=REPO)
    rig.processes.append(worker)
    worker.wait_for(" ready.", timeout=60)
    rig.claimer()
    ids = rig.enqueue(rig.rb, lanes=4, per_lane=2) + rig.enqueue(rig.amo, lanes=2, per_lane=1)
    rows = rig.wait_ended(ids, timeout=30)
    assert {r["state"] for r in rows} == {"DONE"}
    assert worker.stop() == 0, worker.output()
    # Every kind's queue, a thread pool; the outbox's own lines are JSON like Celery's.
    started = [
        json.loads(line)
        for line in worker.output().splitlines()
        if line.startswith("{") and "outbox worker runtime started" in line
    ]
    assert started, worker.output()[-3000:]


@pytest.mark.parametrize("pool_args", [["--threads", "2"], ["--processes", "2"]])
def test_a_celery_worker_serves_the_attempts_of_every_process_on_the_metrics_port(
    rig: CeleryRig, pool_args: list[str]
) -> None:
    import socket
    import sys
    import urllib.request

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**rig.env(), "OUTBOX_METRICS_PORT": str(port)}
    argv = [sys.executable, "-m", "outbox", "worker", APP, "--fabric", "celery", *pool_args]
    worker = OutboxProcess(argv, env, cwd=REPO)
    rig.processes.append(worker)
    worker.wait_for("serving metrics on", timeout=60)
    rig.claimer()
    ids = rig.enqueue(rig.rb, lanes=6, per_lane=1)
    rig.wait_ended(ids, timeout=30)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    done = [
        line
        for line in text.splitlines()
        if line.startswith("outbox_action_attempts_total{") and f'kind="{rig.rb}"' in line
    ]
    assert done and sum(float(line.rsplit(" ", 1)[1]) for line in done) == 6, text[-3000:]
