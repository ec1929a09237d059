"""The Celery fabric's parts in-process, on real PostgreSQL, Redis and RabbitMQ: the setting that
chooses it, the tasks' options (what Celery's redeliveries meet), the one-line install on a
shop's app, the claimer's pushes through Celery (after the commit, in messages of pairs, given
back when the broker fails), its broker check, and the worker command."""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
import redis
from celery import Celery
from celery.exceptions import SoftTimeLimitExceeded

import outbox.celery
from outbox import ActionKind, ActionRequest, ConfigurationError, Done, Outbox, Settings
from outbox.dispatch import Claimer
from outbox.dispatch.celery_fabric import TASK_PREFIX, install, outbox_app
from outbox.dispatch.commands import celery_worker_argv
from outbox.dispatch.runtime import TIME_LIMIT_GRACE, run_on_loop
from outbox.fence_token import FenceToken


class Noop:
    async def execute(self, attempt: Any) -> Done:
        return Done()


def _outbox(make_outbox: Any, schema: str, **overrides: Any) -> tuple[Outbox, str]:
    kind = f"K_{schema.upper()}"
    outbox = make_outbox(**overrides)
    outbox.register(ActionKind(kind), Noop())
    outbox.migrate()
    return outbox, kind


def _enqueue(outbox: Outbox, kind: str, n: int) -> list[int]:
    with psycopg.connect(outbox.settings.require_database_url()) as conn:
        return [
            outbox.enqueue(
                conn,
                ActionRequest(
                    kind=kind,
                    workspace_id="w",
                    lane_key=f"lane-{i}",
                    idempotency_key=f"{kind}-{i}",
                    payload={},
                ),
            ).id
            for i in range(n)
        ]


@pytest.fixture
def clean_redis(redis_url: str, schema: str) -> Iterator[None]:
    yield
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"*{schema}*"):
        client.delete(key)


def _queued(redis_url: str, queue: str) -> list[dict[str, Any]]:
    """The Celery messages waiting on ``queue`` in Redis (kombu keeps a queue as a list)."""
    client = redis.Redis.from_url(redis_url)
    return [json.loads(raw) for raw in client.lrange(queue, 0, -1)]


def test_the_fabric_setting_comes_from_the_environment_and_refuses_unknown_names() -> None:
    assert Settings.from_env({}).fabric == "dramatiq"
    settings = Settings.from_env({"OUTBOX_FABRIC": "celery", "OUTBOX_CELERY_APP": "m:app"})
    assert (settings.fabric, settings.celery_app) == ("celery", "m:app")
    with pytest.raises(ConfigurationError, match="OUTBOX_FABRIC"):
        Settings.from_env({"OUTBOX_FABRIC": "rq"})


def test_one_task_per_kind_acked_late_never_retried_json_without_results(
    make_outbox: Any, schema: str, redis_url: str
) -> None:
    outbox, kind = _outbox(make_outbox, schema, broker_url=redis_url)
    app = outbox_app(redis_url)
    dispatch = install(outbox, app)
    assert dispatch.kinds == [kind]
    assert dispatch.queues == [outbox.kinds[kind].queue_name]
    task = dispatch.tasks[kind]
    assert task.name == f"{TASK_PREFIX}{kind.lower()}"
    assert app.tasks[task.name].name == task.name
    # A message whose worker died goes back to the queue; its epoch's take drops the twin.
    assert task.acks_late and task.reject_on_worker_lost
    assert task.ignore_result and task.serializer == "json" and task.max_retries == 0
    # The executor ends an attempt at its lease; Celery's limits come a grace later.
    lease = int(outbox.settings.lease.total_seconds())
    assert task.soft_time_limit == lease + TIME_LIMIT_GRACE.total_seconds()
    assert task.time_limit > task.soft_time_limit
    # The app the outbox builds prefetches one message a slot and needs no result backend.
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.result_backend is None and app.conf.task_ignore_result
    assert app.conf.task_acks_late and app.conf.task_reject_on_worker_lost
    # Installing again returns the same fabric; another app is refused.
    assert install(outbox, app) is dispatch and install(outbox) is dispatch
    with pytest.raises(ValueError, match="another Celery app"):
        install(outbox, Celery("other", set_as_current=False))


def test_a_shops_app_gets_the_tasks_in_one_line_and_keeps_its_own_settings(
    make_outbox: Any, schema: str, redis_url: str
) -> None:
    outbox_, kind = _outbox(make_outbox, schema)
    shop = Celery("shop", broker=redis_url, set_as_current=False)
    shop.conf.update(worker_prefetch_multiplier=4, task_default_queue="shop")

    @shop.task(name=f"shop_task_{schema}")
    def shop_task() -> None:
        pass

    dispatch = outbox.celery.install(outbox_, shop)
    assert dispatch.app is shop and outbox.celery.installed(outbox_) is dispatch
    assert f"shop_task_{schema}" in shop.tasks and dispatch.tasks[kind].name in shop.tasks
    # The shop's configuration is its own: the outbox sets options on its tasks only.
    assert shop.conf.worker_prefetch_multiplier == 4
    assert shop.conf.task_default_queue == "shop"


@pytest.mark.parametrize(("per_message", "messages"), [(1, 5), (2, 3), (8, 1)])
async def test_claimer_pushes_pairs_on_the_kinds_queue_only_after_its_claim_committed(
    make_outbox: Any,
    schema: str,
    redis_url: str,
    database_url: str,
    clean_redis: None,
    per_message: int,
    messages: int,
) -> None:
    outbox_, kind = _outbox(make_outbox, schema, actions_per_message=per_message)
    app = outbox_app(redis_url)
    dispatch = install(outbox_, app)
    seen: list[tuple[int, str, int]] = []

    def see_committed(body: Any = None, **_: Any) -> None:
        """At publish time, looks at the message's actions from another connection."""
        args = body[0]
        for token in FenceToken.from_args(args):
            with psycopg.connect(database_url) as conn:
                row = conn.execute(
                    f'SELECT state, epoch FROM "{schema}".agent_action WHERE id = %s',
                    (token.action_id,),
                ).fetchone()
            assert row is not None
            seen.append((token.action_id, row[0], row[1] - token.epoch))

    from celery import signals

    signals.before_task_publish.connect(see_committed)
    try:
        ids = _enqueue(outbox_, kind, 5)
        async with outbox_.store() as store:
            result = await Claimer(dispatch, store).run_once()
    finally:
        signals.before_task_publish.disconnect(see_committed)
    assert result.pushed == 5
    assert sorted(seen) == [(i, "EXECUTING", 0) for i in ids]
    queued = _queued(redis_url, outbox_.kinds[kind].queue_name)
    assert len(queued) == messages
    assert {m["headers"]["task"] for m in queued} == {dispatch.tasks[kind].name}
    assert all(m["content-type"] == "application/json" for m in queued)
    pairs = [json.loads(__import__("base64").b64decode(m["body"]))[0] for m in queued]
    assert sorted(t.action_id for p in pairs for t in FenceToken.from_args(p)) == sorted(ids)


async def test_claimers_together_keep_the_in_flight_bound_on_celery(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    outbox_, kind = _outbox(make_outbox, schema, in_flight=3)
    dispatch = install(outbox_, outbox_app(redis_url))
    _enqueue(outbox_, kind, 20)
    async with outbox_.store() as one, outbox_.store() as two:
        rounds = await asyncio.gather(
            *(Claimer(dispatch, store).run_once() for store in (one, two, one, two))
        )
        assert sum(len(r.claimed) for r in rounds) == 3
        assert (await one.in_flight([kind]))[kind] == 3
        again = await Claimer(dispatch, one).run_once()
        assert again.claimed == [] and again.in_flight == {kind: 3}
    assert len(_queued(redis_url, outbox_.kinds[kind].queue_name)) == 1  # 3 pairs, one message


@pytest.mark.parametrize("scheme", ["redis", "amqp"])
async def test_an_unreachable_broker_fails_the_push_at_once_and_the_claims_are_given_back(
    make_outbox: Any, schema: str, scheme: str
) -> None:
    # Nothing listens on port 1: Celery's own publish retries would wait; the fabric's do not.
    url = f"{scheme}://127.0.0.1:1/0" if scheme == "redis" else "amqp://guest:guest@127.0.0.1:1//"
    outbox_, kind = _outbox(make_outbox, schema, push_timeout=timedelta(seconds=30))
    dispatch = install(outbox_, outbox_app(url))
    ids = _enqueue(outbox_, kind, 3)
    started = time.monotonic()
    with pytest.raises(Exception):  # noqa: B017 - kombu's or redis's connection error
        dispatch.check_broker()
    async with outbox_.store() as store:
        claimer = Claimer(dispatch, store)
        result = await claimer.run_once()
        assert result.pushed == 0 and claimer.totals["released"] == 3
        assert not claimer.gate.open
        claimer.off_loop.close()
    # Long before the push timeout: the push failed, it did not hang.
    assert time.monotonic() - started < 10
    with psycopg.connect(outbox_.settings.require_database_url()) as conn:
        states = conn.execute(
            f'SELECT state, attempt FROM "{schema}".agent_action WHERE id = ANY(%s)', (ids,)
        ).fetchall()
    assert states == [("ADMITTED", 0)] * 3, "a claim whose push failed must be due again at once"


def test_the_broker_identity_is_a_redis_run_and_none_on_rabbitmq(
    make_outbox: Any, schema: str, redis_url: str, rabbitmq_url: str
) -> None:
    """What the claimer's restart watch reads: a Redis transport names its run; RabbitMQ,
    whose durable queues keep their messages over a restart, names none."""
    run_id = redis.Redis.from_url(redis_url).info("server")["run_id"]
    on_redis, _ = _outbox(make_outbox, schema)
    assert install(on_redis, outbox_app(redis_url)).broker_identity() == run_id
    on_rabbitmq, _ = _outbox(make_outbox, schema)
    assert install(on_rabbitmq, outbox_app(rabbitmq_url)).broker_identity() is None
    # Known from the URL, without a connection (the claimer asks every second): none is made
    # to a RabbitMQ that is not there.
    nowhere, _ = _outbox(make_outbox, schema)
    assert (
        install(nowhere, outbox_app("amqp://guest:guest@127.0.0.1:1//")).broker_identity() is None
    )


def test_a_soft_time_limit_in_the_waiting_thread_cancels_the_attempt() -> None:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    cancelled = threading.Event()

    async def attempt() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def soft_limit(*_: Any) -> None:
        raise SoftTimeLimitExceeded()

    # Celery's prefork pool raises SoftTimeLimitExceeded from a signal handler in the task's
    # thread, as here.
    previous = signal.signal(signal.SIGALRM, soft_limit)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(SoftTimeLimitExceeded):
            run_on_loop(loop, attempt)
        assert cancelled.wait(5), "the attempt was not cancelled"
    finally:
        signal.signal(signal.SIGALRM, previous)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


def test_celery_worker_command_threads_for_one_process_prefork_for_several() -> None:
    def argv(processes: int, threads: int, queues: list[str] | None = None) -> list[str]:
        args = argparse.Namespace(
            processes=processes,
            threads=threads,
            queues=queues,
            dramatiq_args=["--max-tasks-per-child", "100"],
        )
        return celery_worker_argv(args, ["outbox.a", "outbox.b"])

    one = argv(1, 16)
    assert one[1:6] == ["-m", "celery", "-A", "outbox.dispatch.celery_worker", "worker"]
    assert one[one.index("--pool") + 1] == "threads"
    assert one[one.index("--concurrency") + 1] == "16"
    assert one[one.index("--queues") + 1] == "outbox.a,outbox.b"
    assert one[-2:] == ["--max-tasks-per-child", "100"]
    several = argv(3, 16, ["outbox.b"])
    assert several[several.index("--pool") + 1] == "prefork"
    assert several[several.index("--concurrency") + 1] == "3"
    assert several[several.index("--queues") + 1] == "outbox.b"


def test_the_celery_app_setting_must_name_a_celery_app() -> None:
    from outbox.dispatch.celery_fabric import app_from_settings

    with pytest.raises(ConfigurationError, match="OUTBOX_CELERY_APP"):
        app_from_settings(Settings(celery_app="outbox.config:Settings"))
    with pytest.raises(ConfigurationError, match="cannot import"):
        app_from_settings(Settings(celery_app="no_such_module_x:app"))
