"""The application the dispatch tests run in real claimer and worker processes.

Its adapters are the "provider": every call and every write is a row in PostgreSQL (in the
test's schema), so a test reads back what happened in every process. Two kinds, named after the
test (``DISPATCH_APP_SUFFIX``) so their Dramatiq queues are the test's own:

- ``RB_<suffix>``, read-back: looks for its earlier write (by the idempotency key as marker)
  before writing again;
- ``AMO_<suffix>``, at-most-once: cannot read back.

Payload knobs: ``retry_while_down`` (answer ``Retry`` before the fence while the test's
``dispatch_down`` table holds a row: the provider is down), ``sleep`` (seconds before the
fence), ``hang_before_fence_attempt`` (on that attempt, hang before the fence until killed),
``hang_after_write_attempt`` (on that attempt, hang after the write until killed),
``fail_read_back_attempt`` (on that attempt, the read-back search raises: an error before the
fence). Environment knobs:
``DISPATCH_APP_OWN_BROKER=1`` builds the application's own broker with an actor of its own (an
existing Dramatiq shop);
``DISPATCH_APP_STALL_PUSH=1`` adds a middleware (on the Celery fabric, a ``before_task_publish``
handler) that records, then stalls, every push (to kill a claimer between its claim's commit and
its push); ``DISPATCH_APP_STOP_IN_CLAIM=PATH`` makes,
once the test created PATH.arm, the first claimer process to create PATH stop itself (SIGSTOP)
inside a claim round, right after it took the claim lock (PATH then holds its pid).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import UTC, datetime
from functools import cache
from typing import Any

import dramatiq
import psycopg
from dramatiq import Broker
from dramatiq.middleware import Middleware, default_middleware
from psycopg_pool import AsyncConnectionPool

from outbox import Abandoned, ActionAttempt, ActionKind, Done, Outbox, Result, Retry
from outbox.dispatch import broker_from_url, install

TABLES = """
CREATE TABLE IF NOT EXISTS {s}.dispatch_call (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id bigint NOT NULL, kind text NOT NULL, lane text NOT NULL,
    epoch bigint NOT NULL, attempt integer NOT NULL, pid integer NOT NULL,
    lease_left double precision NOT NULL,
    started_at timestamptz NOT NULL DEFAULT clock_timestamp(), finished_at timestamptz);
CREATE TABLE IF NOT EXISTS {s}.dispatch_effect (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    action_id bigint NOT NULL, marker text NOT NULL, epoch bigint NOT NULL,
    called_at timestamptz NOT NULL, written_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS {s}.dispatch_stall (
    message_id text NOT NULL, args text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS {s}.dispatch_down (
    since timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE TABLE IF NOT EXISTS {s}.dispatch_shop (
    note text NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp());
"""


def create_tables(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(TABLES.format(s=f'"{schema}"'))


def kinds(suffix: str) -> tuple[ActionKind, ActionKind]:
    return ActionKind(f"RB_{suffix}"), ActionKind(f"AMO_{suffix}", at_most_once=True)


class Provider:
    """The recorded "outside world": one small pool per process, on the worker's event loop."""

    def __init__(self, database_url: str, schema: str) -> None:
        self.database_url = database_url
        self.s = f'"{schema}"'
        self._pool: AsyncConnectionPool | None = None

    async def pool(self) -> AsyncConnectionPool:
        if self._pool is None:
            pool = AsyncConnectionPool(
                self.database_url, min_size=1, max_size=4, kwargs={"autocommit": True}, open=False
            )
            await pool.open(wait=True)
            self._pool = pool
        return self._pool

    async def execute(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        pool = await self.pool()
        async with pool.connection() as conn:
            cur = await conn.execute(query.format(s=self.s), params)
            return await cur.fetchall() if cur.description else []


class RecordingAdapter:
    """Records each call (start, end) and each write; reads back first if ``read_back``."""

    def __init__(self, provider: Provider, read_back: bool) -> None:
        self.provider = provider
        self.read_back = read_back

    async def execute(self, attempt: ActionAttempt) -> Result:
        p = self.provider
        payload = attempt.payload or {}
        rows = await p.execute(
            "INSERT INTO {s}.dispatch_call (action_id, kind, lane, epoch, attempt, pid, lease_left)"
            " VALUES (%s, %s, %s, %s, %s, %s, %s) RETURNING id",
            (
                attempt.id,
                attempt.kind,
                attempt.lane_key,
                attempt.epoch,
                attempt.attempt,
                os.getpid(),
                attempt.time_left(),
            ),
        )
        call_id = rows[0][0]
        try:
            return await self._execute(attempt, payload)
        finally:
            await p.execute(
                "UPDATE {s}.dispatch_call SET finished_at = clock_timestamp() WHERE id = %s",
                (call_id,),
            )

    async def _execute(self, attempt: ActionAttempt, payload: dict[str, Any]) -> Result:
        p = self.provider
        if self.read_back and attempt.write_started:
            if payload.get("fail_read_back_attempt") == attempt.attempt:
                raise ConnectionError("the provider's search failed")
            found = await p.execute(
                "SELECT id FROM {s}.dispatch_effect WHERE marker = %s", (attempt.idempotency_key,)
            )
            if found:
                return Done(ref=f"effect-{found[0][0]}")
        if payload.get("retry_while_down") and await p.execute(
            "SELECT 1 FROM {s}.dispatch_down", ()
        ):
            return Retry(reason="PROVIDER_DOWN")
        if payload.get("sleep"):
            await asyncio.sleep(payload["sleep"])
        if payload.get("hang_before_fence_attempt") == attempt.attempt:
            await asyncio.sleep(3600)  # until the test kills this worker
        if not await attempt.fence().begin_write():
            return Abandoned()
        # The provider's clock: when the call starts, what a provider's rate window counts (the
        # write below waits for a connection of this app's small pool first).
        called_at = datetime.now(UTC)
        rows = await p.execute(
            "INSERT INTO {s}.dispatch_effect (action_id, marker, epoch, called_at)"
            " VALUES (%s, %s, %s, %s) RETURNING id",
            (attempt.id, attempt.idempotency_key, attempt.epoch, called_at),
        )
        if payload.get("hang_after_write_attempt") == attempt.attempt:
            await asyncio.sleep(3600)  # until the test kills this worker
        return Done(ref=f"effect-{rows[0][0]}")


class StallBeforePush(Middleware):
    """Records each push, then never lets it reach the broker (the test kills the claimer)."""

    def __init__(self, database_url: str, schema: str) -> None:
        self.database_url = database_url
        self.schema = schema

    def before_enqueue(self, broker: Broker, message: Any, delay: Any) -> None:
        with psycopg.connect(self.database_url, autocommit=True) as conn:
            conn.execute(
                f'INSERT INTO "{self.schema}".dispatch_stall (message_id, args) VALUES (%s, %s)',
                (message.message_id, repr(message.args)),
            )
        time.sleep(3600)


def build(
    database_url: str,
    schema: str,
    suffix: str,
    *,
    own_broker: bool = False,
    stall_push: bool = False,
    **overrides: Any,
) -> Outbox:
    """The test application's ``Outbox`` (and, for a Dramatiq shop, its broker and actor)."""
    outbox = Outbox(database_url, schema=schema, **overrides)
    provider = Provider(database_url, schema)
    rb, amo = kinds(suffix)
    outbox.register(rb, RecordingAdapter(provider, read_back=True))
    outbox.register(amo, RecordingAdapter(provider, read_back=False))
    if outbox.settings.fabric == "celery":
        if stall_push:
            stall_celery_publishes(database_url, schema)
        return outbox
    if own_broker or stall_push:
        middleware = [m() for m in default_middleware]
        if stall_push:
            middleware.append(StallBeforePush(database_url, schema))
        broker = broker_from_url(outbox.settings.broker_url or "", middleware=middleware)
        if own_broker:
            dramatiq.set_broker(broker)
            _declare_shop_actor(broker, database_url, schema, suffix)
        install(outbox, broker)
    return outbox


def stall_celery_publishes(database_url: str, schema: str) -> None:
    """The Celery fabric's ``StallBeforePush``: records each publish, then stalls it."""
    from celery import signals

    def stall(headers: dict[str, Any] | None = None, body: Any = None, **_: Any) -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(
                f'INSERT INTO "{schema}".dispatch_stall (message_id, args) VALUES (%s, %s)',
                ((headers or {}).get("id", ""), repr(body)),
            )
        time.sleep(3600)

    signals.before_task_publish.connect(stall, weak=False)


def _declare_shop_actor(broker: Broker, database_url: str, schema: str, suffix: str) -> None:
    """The shop's own actor, on the shop's own queue, next to the outbox's."""

    def shop_note(note: str) -> None:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'INSERT INTO "{schema}".dispatch_shop (note) VALUES (%s)', (note,))

    dramatiq.actor(
        shop_note,
        actor_name=f"shop_note_{suffix.lower()}",
        queue_name=shop_queue(suffix),
        broker=broker,
    )


def shop_queue(suffix: str) -> str:
    return f"shop_{suffix.lower()}"


def stop_inside_claim_round(marker: str) -> None:
    """Wraps the claimer's round planning (``plan_claim_round``): once the claim lock is held
    (and ``marker.arm`` exists), the first process to create ``marker`` writes its pid there and
    stops itself, holding the lock, until SIGCONT. The lock is held once the operation's first
    statement answered: the lock itself, or the statement the claimer sent with the guard that
    took it."""
    import signal

    from outbox.dispatch import claimer

    original = claimer.plan_claim_round

    def stopping(*args: Any, **kwargs: Any) -> Any:
        inner = original(*args, **kwargs)
        statement = next(inner)
        first = True
        while True:
            rows = yield statement
            locked = first or "pg_advisory_xact_lock" in statement.sql
            first = False
            if locked and os.path.exists(f"{marker}.arm"):
                try:
                    fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                except FileExistsError:
                    pass
                else:
                    os.write(fd, str(os.getpid()).encode())
                    os.close(fd)
                    os.kill(os.getpid(), signal.SIGSTOP)
            try:
                statement = inner.send(rows)
            except StopIteration as done:
                return done.value

    claimer.plan_claim_round = stopping  # type: ignore[assignment]


@cache
def make_outbox() -> Outbox:
    """``tests.apps.dispatch_app:make_outbox``: the app from the environment."""
    if os.environ.get("DISPATCH_APP_STOP_IN_CLAIM"):
        stop_inside_claim_round(os.environ["DISPATCH_APP_STOP_IN_CLAIM"])
    return build(
        os.environ["OUTBOX_DATABASE_URL"],
        os.environ["OUTBOX_SCHEMA"],
        os.environ["DISPATCH_APP_SUFFIX"],
        own_broker=os.environ.get("DISPATCH_APP_OWN_BROKER") == "1",
        stall_push=os.environ.get("DISPATCH_APP_STALL_PUSH") == "1",
    )


def shop_broker() -> None:
    """``dramatiq tests.apps.dispatch_app:shop_broker``: the shop's one worker command."""
    make_outbox()
