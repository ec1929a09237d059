"""The applications the broker scenarios run in real ``outbox claimer`` / ``outbox worker`` and
``dramatiq`` processes, configured by the environment the scenario hands them.

- ``benchmarks.apps:outbox_app``: an ``Outbox`` with one no-op kind whose adapter passes its
  fence and returns ``Done``; with ``BENCH_RECORD_STARTS=1`` it first records the wall-clock time
  it started (Redis hash ``bench:<run id>:starts``, by action id) for the latency scenario (an
  action whose payload says ``"record": true`` is recorded always), with ``BENCH_RECORD_CALLS=1``
  the time of its "provider call" after the fence (``bench:<run id>:calls``) for ``rate``;
  with ``BENCH_PROVIDER_SECONDS=<s>`` that call waits ``s`` seconds (a slow provider:
  ``slow-provider``, ``memory``); with ``BENCH_PROVIDER_OUTAGE=1``, while the Redis key
  ``bench:<run id>:outage`` exists the call fails as a provider that is down fails (``Retry``,
  nothing written), and every call is counted, down or up (``provider-outage``); with
  ``BENCH_IDLE_KINDS=<n>`` it serves n more kinds that never get an action.
- ``benchmarks.apps:raw_broker``: the same broker with one plain Dramatiq actor and no outbox,
  the ceiling of the e2e scenario.

Whatever the broker (``OUTBOX_BROKER_URL``: Redis, or RabbitMQ in the ``rabbitmq`` scenarios),
what a scenario reads back is recorded on the benchmarks' Redis (``REDIS_URL``).
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from functools import cache
from typing import Any

import dramatiq
import redis
import redis.asyncio
from dramatiq import Broker

from benchmarks.common import NOOP, REDIS_URL, RUN_ID
from outbox import Abandoned, ActionAttempt, ActionKind, Defer, Done, Outbox, Result, Retry
from outbox.dispatch import broker_from_url

#: Connections a worker process's recorder may hold at once (more recordings wait for one).
RECORDER_CONNECTIONS = 32
#: Where the adapter and the raw actor record what the scenario reads back.
STARTS_KEY = f"bench:{RUN_ID}:starts"
CALLS_KEY = f"bench:{RUN_ID}:calls"
#: How long an action waits after Dramatiq's limiter refused it (the ``rate`` comparison).
DRAMATIQ_LIMITER_RETRY = timedelta(milliseconds=50)
#: While this key exists the provider is down (``BENCH_PROVIDER_OUTAGE``); the calls it took
#: while down and while up are counted in ``OUTAGE_CALLS_KEY`` (fields ``down``, ``up``).
OUTAGE_KEY = f"bench:{RUN_ID}:outage"
OUTAGE_CALLS_KEY = f"bench:{RUN_ID}:outage:calls"
#: What a call to the provider while it is down ends in (the reason an attempt records).
PROVIDER_DOWN = "PROVIDER_DOWN"
RAW_DONE_KEY = f"bench:{RUN_ID}:raw:done"
RAW_LATENCY_KEY = f"bench:{RUN_ID}:raw:latency"


def raw_queue(run_id: str) -> str:
    """A run's raw actor queue (the outbox's is its no-op kind's ``queue_name``)."""
    return f"bench.raw.{run_id}"


RAW_QUEUE = raw_queue(RUN_ID)
#: The outbox's actors run under a time limit of one lease; the raw actor gets the same.
TIME_LIMIT_MS = 5 * 60 * 1000


class NoopAdapter:
    """Passes the fence, then reports the effect done: all the outbox's own work, no effect.

    Records its start when every start is recorded (``record_starts``) or when the action's
    payload asks (``{"record": true}``: the one transactional action among a bulk backlog);
    with ``record_calls``, the wall-clock time its "provider call" came (right after the
    fence), in ``CALLS_KEY``. With ``dramatiq_limiter`` (a Dramatiq ``RateLimiter``), the call
    waits on that limiter instead of the outbox's: a failed acquire defers the action briefly.
    """

    def __init__(
        self,
        *,
        record_starts: bool = False,
        record_calls: bool = False,
        dramatiq_limiter: Any = None,
        provider_seconds: float = 0.0,
        outage: bool = False,
    ) -> None:
        self._client: redis.asyncio.Redis | None = None
        self.record_starts = record_starts
        self.record_calls = record_calls
        self.dramatiq_limiter = dramatiq_limiter
        self.provider_seconds = provider_seconds
        self.outage = outage

    def _redis(self) -> redis.asyncio.Redis:
        # A pool that makes a recording wait for a free connection: a worker process runs up
        # to threads x actions a message (256) adapters at once, and redis-py's default pool
        # (100 connections) raised MaxConnectionsError in a burst (``cold-start``), which the
        # executor took for the adapter's failure before its fence and retried seconds later.
        if self._client is None:
            pool = redis.asyncio.BlockingConnectionPool.from_url(
                REDIS_URL, max_connections=RECORDER_CONNECTIONS, timeout=None
            )
            self._client = redis.asyncio.Redis(connection_pool=pool)
        return self._client

    async def execute(self, attempt: ActionAttempt) -> Result:
        record = isinstance(attempt.payload, dict) and attempt.payload.get("record")
        if self.record_starts or record:
            await self._redis().hset(STARTS_KEY, str(attempt.id), repr(time.time()))
        if self.dramatiq_limiter is not None:
            with self.dramatiq_limiter.acquire(raise_on_failure=False) as acquired:
                if not acquired:
                    return Defer(DRAMATIQ_LIMITER_RETRY, "DRAMATIQ_RATE_LIMITED")
                return await self._call(attempt)
        return await self._call(attempt)

    async def _call(self, attempt: ActionAttempt) -> Result:
        if not await attempt.fence().begin_write():
            return Abandoned()
        if self.record_calls:
            await self._redis().hset(CALLS_KEY, str(attempt.id), repr(time.time()))
        if self.provider_seconds:
            await asyncio.sleep(self.provider_seconds)
        if self.outage:
            client = self._redis()
            down = bool(await client.exists(OUTAGE_KEY))
            await client.hincrby(OUTAGE_CALLS_KEY, "down" if down else "up", 1)
            if down:
                # A refused connection: the provider proved it holds nothing.
                return Retry(reason=PROVIDER_DOWN)
        return Done(ref="noop")


def _dramatiq_limiter() -> Any:
    """``BENCH_LIMITER=dramatiq-window:<n>``: Dramatiq's sliding-window limiter on Redis, n
    a second, shared by every worker (the alternative the ``rate`` scenario compares)."""
    spec = os.environ.get("BENCH_LIMITER", "")
    if not spec.startswith("dramatiq-window:"):
        return None
    from dramatiq.rate_limits import WindowRateLimiter
    from dramatiq.rate_limits.backends import RedisBackend

    backend = RedisBackend(url=REDIS_URL)
    limit = int(spec.split(":", 1)[1])
    return WindowRateLimiter(backend, f"bench:{RUN_ID}:window", limit=limit, window=1)


@cache
def outbox_app() -> Outbox:
    """The outbox the claimer and the workers load (``OUTBOX_*`` settings from the scenario)."""
    outbox = Outbox()
    adapter = NoopAdapter(
        record_starts=os.environ.get("BENCH_RECORD_STARTS") == "1",
        record_calls=os.environ.get("BENCH_RECORD_CALLS") == "1",
        dramatiq_limiter=_dramatiq_limiter(),
        provider_seconds=float(os.environ.get("BENCH_PROVIDER_SECONDS", "0")),
        outage=os.environ.get("BENCH_PROVIDER_OUTAGE") == "1",
    )
    outbox.register(NOOP, adapter)
    for kind in idle_kinds():
        outbox.register(kind, adapter)
    return outbox


def idle_kinds() -> list[ActionKind]:
    """``BENCH_IDLE_KINDS=<n>``: n more kinds the claimer and the workers serve, of which no
    action is ever enqueued (``latency-8-kinds``: what serving many kinds costs one kind's
    latency)."""
    n = int(os.environ.get("BENCH_IDLE_KINDS", "0"))
    return [ActionKind(f"BENCH_IDLE_{i}_{RUN_ID.upper()}") for i in range(n)]


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(REDIS_URL)


def raw_noop(sent_at: float | None = None, body: str | None = None) -> None:
    """Counts itself done; with ``sent_at``, records how long after it was sent it started.
    ``body``: what the message carried besides (``payload``), unread."""
    started = time.time()
    client = _redis()
    if sent_at is not None:
        client.rpush(RAW_LATENCY_KEY, repr(started - sent_at))
    client.incr(RAW_DONE_KEY)


def raw_broker() -> Broker:
    """``dramatiq benchmarks.apps:raw_broker``: the broker from ``OUTBOX_BROKER_URL`` (the
    benchmarks' Redis by default) with Dramatiq's default middleware (as the outbox's) and the
    one raw actor."""
    broker = raw_broker_at(os.environ.get("OUTBOX_BROKER_URL", REDIS_URL))
    dramatiq.set_broker(broker)
    return broker


@cache
def raw_broker_at(url: str) -> Broker:
    """The raw actor's broker at ``url``, built as the outbox builds its own
    (``broker_from_url``: on RabbitMQ, with confirmed delivery), once a process."""
    broker = broker_from_url(url)
    dramatiq.actor(
        raw_noop,
        actor_name="bench_raw_noop",
        queue_name=RAW_QUEUE,
        broker=broker,
        max_retries=0,
        time_limit=TIME_LIMIT_MS,
    )
    return broker
