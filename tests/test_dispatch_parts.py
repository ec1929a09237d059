"""The dispatch's parts in-process, on real PostgreSQL and Redis: broker choice, the actors'
options, taking a message once per epoch, and the claimer's bound, commit order and wake-up."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import shutil
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import dramatiq
import dramatiq.broker
import psycopg
import pytest
import redis
from dramatiq.brokers.rabbitmq import RabbitmqBroker
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import Middleware
from hypothesis import given
from hypothesis import strategies as st
from psycopg import AsyncClientCursor

from benchmarks.chaos.servers import REDIS_SERVER, PrivateRedis
from outbox import ActionKind, ActionRequest, ConfigurationError, Done, Outbox, Settings
from outbox._io import Statement, run_async
from outbox.dispatch import Claimer, broker_from_url, default_broker, install
from outbox.dispatch.actors import TIME_LIMIT_GRACE, actor_options, even_chunks
from outbox.dispatch.claim_guard import open_claim_round
from outbox.dispatch.claimer import bounded_claim_operation
from outbox.dispatch.commands import worker_argv
from outbox.dispatch.consumption import ConsumptionWatch
from outbox.dispatch.runtime import WorkerRuntime
from outbox.dispatch.wake import WAKE_KEEP, WAKE_TTL_MS, wake_key
from outbox.fence_token import FenceToken
from outbox.queries import queries_for
from tests.services import missing_service

LEASE = timedelta(seconds=30)


class Noop:
    async def execute(self, attempt: Any) -> Done:
        return Done()


def _outbox(make_outbox: Any, schema: str, **overrides: Any) -> tuple[Outbox, str]:
    kind = f"K_{schema.upper()}"
    outbox = make_outbox(**overrides)
    outbox.register(ActionKind(kind), Noop())
    outbox.migrate()
    return outbox, kind


def _enqueue(outbox: Outbox, kind: str, n: int, lanes: int | None = None) -> list[int]:
    with psycopg.connect(outbox.settings.require_database_url()) as conn:
        return [
            outbox.enqueue(
                conn,
                ActionRequest(
                    kind=kind,
                    workspace_id="w",
                    lane_key=f"lane-{i % (lanes or n)}",
                    idempotency_key=f"{kind}-{i}",
                    payload={},
                ),
            ).id
            for i in range(n)
        ]


@pytest.fixture
def clean_redis(redis_url: str, schema: str):
    yield
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match=f"*{schema}*"):
        client.delete(key)


def test_broker_url_chooses_redis_or_rabbitmq_and_refuses_anything_else() -> None:
    assert isinstance(broker_from_url("redis://127.0.0.1:6379/15"), RedisBroker)
    rabbit = broker_from_url("amqp://guest:guest@127.0.0.1:5672/%2F")
    assert isinstance(rabbit, RabbitmqBroker)
    assert rabbit.confirm_delivery, "a push must return only once RabbitMQ holds the message"
    with pytest.raises(ConfigurationError, match="OUTBOX_BROKER_URL"):
        broker_from_url("kafka://127.0.0.1:9092")


def test_without_a_url_the_applications_global_broker_else_local_redis(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(dramatiq.broker, "global_broker", None)
    fallback = default_broker(None)
    assert isinstance(fallback, RedisBroker)
    shop = broker_from_url("redis://127.0.0.1:6379/15")
    monkeypatch.setattr(dramatiq.broker, "global_broker", shop)
    assert default_broker(None) is shop
    assert default_broker("amqp://127.0.0.1") is not shop, "an explicit URL wins"


def test_settings_come_from_the_environment_and_code_overrides_them() -> None:
    env = {
        "OUTBOX_DATABASE_URL": "postgresql://db/app",
        "OUTBOX_BROKER_URL": "amqp://rabbit",
        "OUTBOX_LEASE_SECONDS": "120",
        "OUTBOX_WRITE_MARGIN_SECONDS": "20",
        "OUTBOX_BATCH_SIZE": "50",
        "OUTBOX_IN_FLIGHT": "16",
        "OUTBOX_POLL_INTERVAL_SECONDS": "2",
    }
    settings = Settings.from_env(env, in_flight=8)
    assert settings.broker_url == "amqp://rabbit"
    assert (settings.lease, settings.write_margin) == (timedelta(minutes=2), timedelta(seconds=20))
    assert (settings.batch_size, settings.in_flight) == (50, 8)
    assert settings.poll_interval == timedelta(seconds=2)


def test_each_kind_gets_its_own_queue_never_retried_by_dramatiq_time_limit_past_the_lease(
    make_outbox: Any, schema: str
) -> None:
    outbox, kind = _outbox(make_outbox, schema, lease=timedelta(seconds=90))
    outbox.register(ActionKind(f"L_{schema.upper()}"), Noop())
    broker = broker_from_url("redis://127.0.0.1:6379/15")
    dispatch = install(outbox, broker)
    assert set(dispatch.actors) == {kind, f"L_{schema.upper()}"}
    queues = {a.queue_name for a in dispatch.actors.values()}
    assert queues == {outbox.kinds[k].queue_name for k in dispatch.actors}
    assert len(queues) == 2
    for act in dispatch.actors.values():
        assert act.broker is broker
        assert act.options["max_retries"] == 0
        assert act.options["time_limit"] == 90_000 + TIME_LIMIT_GRACE.total_seconds() * 1000
    assert install(outbox) is dispatch, "installing twice joins the actors once"
    with pytest.raises(ValueError):
        install(outbox, broker_from_url("redis://127.0.0.1:6379/15"))


def test_a_shops_broker_without_retries_or_time_limit_middleware_still_takes_the_actors(
    make_outbox: Any, schema: str
) -> None:
    outbox, kind = _outbox(make_outbox, schema)
    bare = broker_from_url("redis://127.0.0.1:6379/15", middleware=[])
    assert actor_options(outbox, bare) == {}
    dispatch = install(outbox, bare)
    assert bare.get_actor(dispatch.actors[kind].actor_name) is dispatch.actors[kind]


async def test_a_message_is_taken_once_per_epoch_and_never_with_a_stale_epoch(
    make_outbox: Any, schema: str
) -> None:
    outbox, kind = _outbox(
        make_outbox, schema, lease=timedelta(seconds=5), write_margin=timedelta(seconds=1)
    )
    [action_id] = _enqueue(outbox, kind, 1)
    async with outbox.store() as store:
        [claimed] = await store.claim({kind: 1}, outbox.settings.lease, take=False)
        epoch = claimed.action.epoch
        assert await store.take_attempt(FenceToken(action_id, epoch - 1)) is None
        taken = await store.take_attempt(FenceToken(action_id, epoch))
        assert taken is not None and taken.lease_left > timedelta(seconds=4)
        assert await store.take_attempt(FenceToken(action_id, epoch)) is None, (
            "a second delivery ran"
        )


async def test_the_claimers_claims_carry_no_payload_and_the_workers_take_loads_it(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    # Lane heads and reclaims of expired leases alike: a claimer that read payloads would hold
    # every payload it claimed (up to OUTBOX_MAX_PAYLOAD_BYTES each) until its round ended.
    outbox, kind = _outbox(
        make_outbox, schema, lease=timedelta(seconds=30), write_margin=timedelta(seconds=1)
    )
    dispatch = install(outbox, broker_from_url(redis_url))
    with psycopg.connect(outbox.settings.require_database_url()) as conn:
        ids = [
            outbox.enqueue(
                conn,
                ActionRequest(
                    kind=kind,
                    workspace_id="w",
                    lane_key=f"lane-{i}",
                    idempotency_key=f"payload-{i}",
                    payload={"i": i, "blob": "x" * 1000},
                ),
            ).id
            for i in range(4)
        ]
    async with outbox.store() as store:
        claimer = Claimer(dispatch, store)
        heads = sorted((await claimer.claim()).claimed, key=lambda c: c.action.id)
        assert [c.action.id for c in heads] == ids
        taken = [await store.take_attempt(c.action.token) for c in heads[:2]]
        assert [t.action.payload["i"] if t else None for t in taken] == [0, 1]
        # Their worker died: the leases ran out, and the next claim reclaims them.
        async with store.connection() as conn:
            await conn.execute(
                f'UPDATE "{schema}".agent_action SET lease_until = now() WHERE id = ANY(%s)',
                (ids[:2],),
            )
        reclaims = (await claimer.claim()).claimed
        assert sorted(c.action.id for c in reclaims) == ids[:2]
        assert [c.action.payload for c in heads + reclaims] == [None] * 6


@pytest.mark.parametrize(("per_message", "messages"), [(1, 5), (2, 3), (8, 1)])
async def test_claimer_pushes_only_after_its_claim_committed(
    make_outbox: Any,
    schema: str,
    redis_url: str,
    database_url: str,
    clean_redis: None,
    per_message: int,
    messages: int,
) -> None:
    outbox, kind = _outbox(make_outbox, schema, actions_per_message=per_message)
    seen: list[tuple[int, str, int]] = []

    class SeeCommitted(Middleware):
        """At push time, looks at the message's actions from another connection."""

        def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
            for token in FenceToken.from_args(message.args):
                with psycopg.connect(database_url) as conn:
                    row = conn.execute(
                        f'SELECT state, epoch FROM "{schema}".agent_action WHERE id = %s',
                        (token.action_id,),
                    ).fetchone()
                assert row is not None
                seen.append((token.action_id, row[0], row[1] - token.epoch))

    broker = broker_from_url(redis_url, middleware=[SeeCommitted()])
    dispatch = install(outbox, broker)
    ids = _enqueue(outbox, kind, 5)
    async with outbox.store() as store:
        result = await Claimer(dispatch, store).run_once()
    assert result.pushed == 5
    assert sorted(seen) == [(i, "EXECUTING", 0) for i in ids]
    client = redis.Redis.from_url(redis_url)
    assert client.hlen(f"dramatiq:{outbox.kinds[kind].queue_name}.msgs") == messages


@pytest.mark.parametrize(
    ("batch_size", "per_message", "claimed", "messages"),
    [(10, 4, 8, 2), (3, 4, 3, 1), (10, 1, 10, 10)],
)
async def test_a_claim_round_takes_whole_messages_of_its_batch(
    make_outbox: Any,
    schema: str,
    redis_url: str,
    clean_redis: None,
    batch_size: int,
    per_message: int,
    claimed: int,
    messages: int,
) -> None:
    # A pool of T threads runs T messages at once: a batch of 10 at 4 a message went out as
    # 4 + 3 + 3, three messages where two full ones carry nearly as much.
    outbox, kind = _outbox(
        make_outbox, schema, batch_size=batch_size, actions_per_message=per_message
    )
    dispatch = install(outbox, broker_from_url(redis_url))
    _enqueue(outbox, kind, 20)
    async with outbox.store() as store:
        result = await Claimer(dispatch, store).run_once()
    assert len(result.claimed) == result.pushed == claimed
    assert result.more_due
    client = redis.Redis.from_url(redis_url)
    assert client.hlen(f"dramatiq:{outbox.kinds[kind].queue_name}.msgs") == messages


async def test_claimers_together_keep_the_in_flight_bound(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    outbox, kind = _outbox(make_outbox, schema, in_flight=3)
    dispatch = install(outbox, broker_from_url(redis_url))
    _enqueue(outbox, kind, 20)
    async with outbox.store() as one, outbox.store() as two:
        rounds = await asyncio.gather(
            *(Claimer(dispatch, store).run_once() for store in (one, two, one, two))
        )
        assert sum(len(r.claimed) for r in rounds) == 3
        assert (await one.in_flight([kind]))[kind] == 3
        again = await Claimer(dispatch, one).run_once()
        assert again.claimed == [] and again.in_flight == {kind: 3}


async def test_claimer_wakes_on_the_enqueue_notify_long_before_its_poll_interval(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    outbox, kind = _outbox(make_outbox, schema, poll_interval=timedelta(seconds=30))
    dispatch = install(outbox, broker_from_url(redis_url))
    stop = asyncio.Event()
    async with outbox.store() as store:
        claimer = Claimer(dispatch, store)
        task = asyncio.create_task(claimer.run(stop))
        while claimer.totals["rounds"] < 1 or claimer._listener is None:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.2)  # now waiting: for a NOTIFY or 30 s
        enqueued = time.monotonic()
        await asyncio.to_thread(_enqueue, outbox, kind, 1)
        while claimer.totals["pushed"] < 1:
            assert time.monotonic() - enqueued < 3, "the claimer did not wake on NOTIFY"
            await asyncio.sleep(0.01)
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_a_claim_round_commits_without_waiting_for_its_wal_flush(
    make_outbox: Any, schema: str
) -> None:
    outbox, _ = _outbox(make_outbox, schema)
    async with outbox.store() as store, store.connection() as conn:
        inside = await open_claim_round(
            conn, schema, outbox.settings, Statement("SHOW synchronous_commit")
        )
        await conn.commit()
        after = await (await conn.execute("SHOW synchronous_commit")).fetchone()
    assert inside == [{"synchronous_commit": "off"}], "the claim round's commit waited"
    assert after == ("on",), "the setting outlived the claim round"


async def test_a_rounds_opening_query_is_bound_once_and_follows_its_bounds(
    make_outbox: Any, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    outbox, _ = _outbox(make_outbox, schema)
    bound: list[str] = []
    mogrify = AsyncClientCursor.mogrify

    def counted(self: Any, query: Any, params: Any = None) -> str:
        bound.append(str(query))
        return mogrify(self, query, params)

    monkeypatch.setattr(AsyncClientCursor, "mogrify", counted)
    first = Statement(
        "SELECT current_setting('lock_timeout') AS lock_timeout, %(n)s::int AS n", {"n": 7}
    )
    longer = dataclasses.replace(outbox.settings, claim_lock_timeout=timedelta(seconds=7))
    seen = []
    async with outbox.store() as store, store.connection() as conn:
        for settings in (outbox.settings, outbox.settings, longer):
            seen.append(await open_claim_round(conn, schema, settings, first))
            await conn.rollback()
        other = await open_claim_round(conn, schema, longer, Statement(first.sql, {"n": 8}))
        await conn.rollback()
    assert len(bound) == 3 * 3, "a round bound its unchanged opening query again"
    assert seen[0] == seen[1] != seen[2] == [{"lock_timeout": "7s", "n": 7}]
    assert other == [{"lock_timeout": "7s", "n": 8}]


async def test_a_rounds_counts_come_after_the_lock_and_see_what_its_holder_claimed(
    make_outbox: Any, schema: str, database_url: str
) -> None:
    outbox, kind = _outbox(make_outbox, schema)
    [action_id] = _enqueue(outbox, kind, 1)
    q = queries_for(schema)
    with psycopg.connect(database_url) as holder:
        # Another claimer's round: holds the lock and claims, then commits while this one waits.
        holder.execute(q["claim_lock"], {"schema": schema})
        holder.execute(
            f'UPDATE "{schema}".agent_action SET state = %s, epoch = epoch + 1, '
            "lease_until = now() + interval '1 minute' WHERE id = %s",
            ("EXECUTING", action_id),
        )

        async def round_() -> Any:
            async with outbox.store() as store, store.connection() as conn:
                op = bounded_claim_operation(
                    schema, [kind], 5, 5, LEASE, ConsumptionWatch(), locked=True
                )
                rows = await open_claim_round(conn, schema, outbox.settings, next(op))
                result = await run_async(conn, op, started=rows)
                await conn.commit()
                return result

        entering = asyncio.create_task(round_())
        await asyncio.sleep(0.3)
        assert not entering.done(), "the round did not wait for the claim lock"
        holder.commit()
        result = await asyncio.wait_for(entering, 5)
    assert result.in_flight == {kind: 1}, "the counts read a snapshot from before the lock"
    assert result.claimed == [], "the round claimed the lane its holder had claimed"


def test_an_idle_consumer_wakes_on_a_push_not_after_its_backoff(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    outbox, kind = _outbox(make_outbox, schema)
    dispatch = install(outbox, broker_from_url(redis_url))
    consumer = dispatch.broker.consume(dispatch.actors[kind].queue_name, prefetch=4, timeout=5000)
    # Idle for long: Dramatiq's backoff is now 2.5 to 5 s between looks at the queue.
    consumer.misses = 30
    received: list[float] = []

    def consume() -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if next(consumer) is not None:
                received.append(time.monotonic())
                return

    thread = threading.Thread(target=consume)
    thread.start()
    time.sleep(0.3)  # inside its idle wait
    pushed = time.monotonic()
    dispatch.push_many([(kind, FenceToken(1, 1))])
    thread.join(12)
    consumer.close()
    assert received, "the consumer never got the message"
    assert received[0] - pushed < 1.0, "the consumer waited out its backoff"


def test_a_wake_token_pushed_while_no_consumer_waits_is_kept_and_bounded(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    outbox, kind = _outbox(make_outbox, schema, actions_per_message=1)
    dispatch = install(outbox, broker_from_url(redis_url))
    queue = dispatch.actors[kind].queue_name
    dispatch.push_many([(kind, FenceToken(i, 1)) for i in range(1, 41)])
    client = redis.Redis.from_url(redis_url)
    key = wake_key(dispatch.broker.namespace, queue)
    assert client.llen(key) == WAKE_KEEP
    assert 0 < client.pttl(key) <= WAKE_TTL_MS
    dispatch.push_batch(kind, [FenceToken(41, 1)])
    assert client.llen(key) == WAKE_KEEP


def test_worker_command_passes_processes_threads_queues_and_dramatiq_options_through() -> None:
    args = argparse.Namespace(
        processes=3, threads=16, queues=["outbox.email"], dramatiq_args=["--verbose"]
    )
    argv = worker_argv(args)
    assert argv[1:4] == ["-m", "outbox.dispatch.launch", "outbox.dispatch.worker"]
    assert argv[4:] == [
        "--processes",
        "3",
        "--threads",
        "16",
        "--queues",
        "outbox.email",
        "--verbose",
    ]


def test_a_worker_runtime_is_ready_once_its_pool_opens_and_says_when_it_is_not(
    make_outbox: Any, schema: str
) -> None:
    from tests.email_sink import free_port

    ready = WorkerRuntime(make_outbox())
    try:
        ready.wait_ready(timeout=30)
        ready.wait_ready(timeout=0.01)  # started once a process: at once the second time
    finally:
        ready.stop()
    down = WorkerRuntime(
        Outbox(f"postgresql://postgres@127.0.0.1:{free_port()}/test", schema=schema)
    )
    started = time.monotonic()
    try:
        with pytest.raises(TimeoutError):
            down.wait_ready(timeout=0.5)
    finally:
        down.stop()  # ends its wait for PostgreSQL at once
    assert time.monotonic() - started < 5


def test_run_on_loop_returns_results_and_an_interrupt_cancels_the_attempt() -> None:
    import ctypes
    import logging
    import threading

    from dramatiq.asyncio import EventLoopThread
    from dramatiq.middleware import TimeLimitExceeded

    from outbox.dispatch.runtime import run_on_loop

    loop_thread = EventLoopThread(logging.getLogger("test"))
    loop_thread.start(timeout=10)
    try:

        async def answer() -> int:
            return 42

        async def boom() -> None:
            raise ValueError("adapter")

        assert run_on_loop(loop_thread.loop, answer) == 42
        with pytest.raises(ValueError, match="adapter"):
            run_on_loop(loop_thread.loop, boom)

        seen: list[str] = []
        began = threading.Event()

        async def long() -> None:
            began.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise

        def worker() -> None:
            try:
                run_on_loop(loop_thread.loop, long)
            except TimeLimitExceeded:
                seen.append("interrupted")

        thread = threading.Thread(target=worker)
        thread.start()
        assert began.wait(10)
        time.sleep(0.2)  # the thread waits for its attempt
        # What Dramatiq's TimeLimit middleware does to a worker thread.
        ctypes.pythonapi.PyThreadState_SetAsyncExc(
            ctypes.c_ulong(thread.ident), ctypes.py_object(TimeLimitExceeded)
        )
        thread.join(10)
        assert seen == ["cancelled", "interrupted"]
    finally:
        loop_thread.stop()


@pytest.mark.parametrize(
    ("per_message", "expected"),
    [(1, [(1, 1), (2, 1), (3, 2)]), (2, [(1, 1, 2, 1), (3, 2)]), (8, [(1, 1, 2, 1, 3, 2)])],
)
def test_push_many_goes_through_enqueue_and_its_middleware_on_redis_and_elsewhere(
    make_outbox: Any,
    schema: str,
    redis_url: str,
    clean_redis: None,
    per_message: int,
    expected: list[tuple[int, ...]],
) -> None:
    from dramatiq.brokers.stub import StubBroker

    outbox, kind = _outbox(make_outbox, schema, actions_per_message=per_message)
    seen: list[tuple[int, ...]] = []

    class See(Middleware):
        def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
            seen.append(tuple(message.args))

    redis_broker = broker_from_url(redis_url, middleware=[See()])
    dispatch = install(outbox, redis_broker)
    dispatch.push_many(
        [(kind, FenceToken(1, 1)), (kind, FenceToken(2, 1)), (kind, FenceToken(3, 2))]
    )
    client = redis.Redis.from_url(redis_url)
    assert client.llen(f"dramatiq:{dispatch.actors[kind].queue_name}") == len(expected)
    assert seen == expected

    other, other_kind = _outbox(make_outbox, schema + "_stub", actions_per_message=per_message)
    stub = StubBroker(middleware=[See()])
    install(other, stub).push_many([(other_kind, FenceToken(4, 1)), (other_kind, FenceToken(5, 1))])
    queued = stub.queues[install(other).actors[other_kind].queue_name].qsize()
    assert queued == (1 if per_message > 1 else 2)
    assert seen[-1] == ((4, 1, 5, 1) if per_message > 1 else (5, 1))


@given(items=st.lists(st.integers(), max_size=60), most=st.integers(1, 12))
def test_even_chunks_are_the_fewest_of_at_most_most_and_nearly_equal(
    items: list[int], most: int
) -> None:
    chunks = list(even_chunks(items, most))
    assert [x for chunk in chunks for x in chunk] == items
    assert len(chunks) == -(-len(items) // most)
    assert all(1 <= len(chunk) <= most for chunk in chunks)
    if chunks:
        assert max(map(len, chunks)) - min(map(len, chunks)) <= 1


def test_a_message_that_is_not_pairs_is_refused_by_name() -> None:
    assert FenceToken.from_args((1, 2)) == [FenceToken(1, 2)]
    assert FenceToken.from_args((1, 2, 3, 4)) == [FenceToken(1, 2), FenceToken(3, 4)]
    assert FenceToken.to_args([FenceToken(1, 2), FenceToken(3, 4)]) == (1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"\(action_id, epoch\) pairs, got 3 values"):
        FenceToken.from_args((1, 2, 3))


@pytest.fixture
def own_redis_url() -> Iterator[str]:
    """A Redis server of this test's own (its scripts are flushed, which the shared one's
    other users must not see)."""
    if shutil.which(REDIS_SERVER) is None:
        missing_service(f"{REDIS_SERVER} not installed (a private Redis is started)")
    with PrivateRedis() as server:
        yield server.url


def _push(dispatch: Any, items: list[tuple[str, FenceToken]], on_loop: bool) -> None:
    """``items`` pushed as the claimer pushes them: from its event loop (``loop_push``) or with
    the blocking ``push_many`` (from a thread)."""
    if not on_loop:
        dispatch.push_many(items)
        return

    async def pushed() -> None:
        pusher = dispatch.loop_push()
        assert pusher is not None
        try:
            await pusher.push_many(items)
        finally:
            await pusher.aclose()

    asyncio.run(pushed())


@pytest.mark.parametrize("on_loop", [False, True], ids=["thread", "event-loop"])
def test_a_push_costs_one_redis_round_trip_and_survives_a_script_flush(
    make_outbox: Any, schema: str, own_redis_url: str, on_loop: bool
) -> None:
    outbox, kind = _outbox(make_outbox, schema, actions_per_message=1)
    dispatch = install(outbox, broker_from_url(own_redis_url))
    client = redis.Redis.from_url(own_redis_url)
    queue = f"dramatiq:{dispatch.actors[kind].queue_name}"
    wakes = wake_key("dramatiq", dispatch.actors[kind].queue_name)

    def calls(command: str) -> int:
        stats = client.info("commandstats").get(f"cmdstat_{command}")
        return int(stats["calls"]) if stats else 0

    # A fresh server knows no script: the first push loads it, the messages go once.
    _push(dispatch, [(kind, FenceToken(i, 1)) for i in range(1, 4)], on_loop)
    assert client.llen(queue) == 3
    client.delete(wakes)  # the refused first send's tokens went too (harmless: spare wakes)
    client.config_resetstat()
    _push(dispatch, [(kind, FenceToken(i, 1)) for i in range(4, 7)], on_loop)
    assert client.llen(queue) == 6
    assert client.llen(wakes) == 3, "each message comes with a wake token"
    assert calls("script|exists") == 0, "a push asked Redis whether it knows the script"
    assert calls("evalsha") == 3
    # Redis lost its scripts (as after a restart): the push loads the script again.
    client.script_flush()
    _push(dispatch, [(kind, FenceToken(i, 1)) for i in range(7, 9)], on_loop)
    assert client.llen(queue) == 8
    ids = [int(m.split(b'"args":[')[1].split(b",")[0]) for m in client.hvals(queue + ".msgs")]
    assert sorted(ids) == list(range(1, 9))


def test_a_push_from_the_event_loop_goes_through_enqueue_and_its_middleware(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    outbox, kind = _outbox(make_outbox, schema, actions_per_message=2)
    seen: list[tuple[int, ...]] = []

    class See(Middleware):
        def before_enqueue(self, broker: Any, message: Any, delay: Any) -> None:
            seen.append(tuple(message.args))

    dispatch = install(outbox, broker_from_url(redis_url, middleware=[See()]))
    _push(
        dispatch,
        [(kind, FenceToken(1, 1)), (kind, FenceToken(2, 1)), (kind, FenceToken(3, 2))],
        True,
    )
    assert seen == [(1, 1, 2, 1), (3, 2)]
    queue = f"dramatiq:{dispatch.actors[kind].queue_name}"
    assert redis.Redis.from_url(redis_url).llen(queue) == 2


def test_only_a_redis_broker_made_from_its_url_is_pushed_from_the_event_loop(
    make_outbox: Any, schema: str, redis_url: str
) -> None:
    """The loop's client is opened from the broker's URL with the outbox's timeouts; a broker
    the application built (its own client, its own options) is pushed from a thread."""
    made, _ = _outbox(make_outbox, schema)
    assert install(made, broker_from_url(redis_url)).loop_push() is not None
    own, _ = _outbox(make_outbox, schema + "_own")
    assert install(own, RedisBroker(url=redis_url)).loop_push() is None
    rabbit, _ = _outbox(make_outbox, schema + "_amqp")
    assert install(rabbit, broker_from_url("amqp://guest:guest@127.0.0.1:5672")).loop_push() is None


async def test_a_running_claimer_pushes_from_its_event_loop_and_closes_its_client(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    outbox, kind = _outbox(make_outbox, schema)
    dispatch = install(outbox, broker_from_url(redis_url))
    stop = asyncio.Event()
    async with outbox.store() as store:
        claimer = Claimer(dispatch, store)
        threaded: list[int] = []
        push_or_unpushed = claimer.push_or_unpushed

        def counted(claimed: Any) -> Any:
            threaded.append(len(claimed))
            return push_or_unpushed(claimed)

        claimer.push_or_unpushed = counted  # type: ignore[method-assign]
        task = asyncio.create_task(claimer.run(stop))
        await asyncio.to_thread(_enqueue, outbox, kind, 3)
        while claimer.totals["pushed"] < 3:
            await asyncio.sleep(0.01)
        pusher = claimer.loop_pusher
        assert pusher is not None and threaded == []
        stop.set()
        await asyncio.wait_for(task, 5)
    assert claimer.loop_pusher is None and pusher._client is None  # type: ignore[attr-defined]
    queue = f"dramatiq:{dispatch.actors[kind].queue_name}"
    assert redis.Redis.from_url(redis_url).llen(queue) >= 1


def _counted_fetches(consumer: Any) -> list[float]:
    """When each fetch of ``consumer`` (its broker's ``do_fetch``) started, from now on."""
    fetches: list[float] = []
    fetch = consumer.broker.do_fetch

    def counted(*args: Any) -> Any:
        fetches.append(time.monotonic())
        return fetch(*args)

    consumer.broker.do_fetch = counted
    return fetches


def test_an_idle_consumer_looks_at_its_queue_once_a_timeout_not_on_a_backoff(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    outbox, kind = _outbox(make_outbox, schema)
    dispatch = install(outbox, broker_from_url(redis_url))
    consumer = dispatch.broker.consume(dispatch.actors[kind].queue_name, prefetch=4, timeout=1000)
    fetches = _counted_fetches(consumer)
    try:
        dispatch.push_many([(kind, FenceToken(1, 1))])
        deadline = time.monotonic() + 5
        while next(consumer) is None:
            assert time.monotonic() < deadline, "the consumer never got the message"
        # Idle now: Dramatiq's backoff would look again after 5, 10, 20, ... ms (7 looks in
        # the next 0.8 s); a consumer woken by tokens looks once and waits for one.
        fetches.clear()
        idle_until = time.monotonic() + 0.8
        while time.monotonic() < idle_until:
            assert next(consumer) is None
    finally:
        consumer.close()
    assert len(fetches) <= 2, f"{len(fetches)} looks at an idle queue in 0.8 s"


def test_a_trickle_of_pushes_costs_one_fetch_a_message(
    make_outbox: Any, schema: str, redis_url: str, clean_redis: None
) -> None:
    outbox, kind = _outbox(make_outbox, schema)
    dispatch = install(outbox, broker_from_url(redis_url))
    consumer = dispatch.broker.consume(dispatch.actors[kind].queue_name, prefetch=4, timeout=1000)
    fetches = _counted_fetches(consumer)

    def trickle() -> None:
        for i in range(1, 11):
            time.sleep(0.05)
            dispatch.push_many([(kind, FenceToken(i, 1))])

    pusher = threading.Thread(target=trickle)
    got: list[int] = []
    try:
        pusher.start()
        deadline = time.monotonic() + 10
        while len(got) < 10 and time.monotonic() < deadline:
            # As Dramatiq's consumer thread: it looks again as soon as it handed a message on.
            message = next(consumer)
            if message is not None:
                got.append(message.args[0])
                consumer.ack(message)
    finally:
        pusher.join(10)
        consumer.close()
    assert got == list(range(1, 11))
    # A fetch that got fewer than it asked for drained the queue: the next message's token
    # comes first, not another fetch that finds nothing.
    assert len(fetches) <= 12, f"{len(fetches)} fetches for 10 messages"
