"""The applications the broker scenarios run in real ``outbox claimer`` / ``outbox worker`` and
``dramatiq`` processes, configured by the environment the scenario hands them.

- ``benchmarks.apps:outbox_app``: an ``Outbox`` with one no-op kind whose adapter passes its
  fence and returns ``Done``; with ``BENCH_RECORD_STARTS=1`` it first records the wall-clock time
  it started (Redis hash ``bench:<run id>:starts``, by action id) for the latency scenario.
- ``benchmarks.apps:raw_broker``: the same broker with one plain Dramatiq actor and no outbox,
  the ceiling of the e2e scenario.
"""

from __future__ import annotations

import os
import time
from functools import cache

import dramatiq
import redis
import redis.asyncio
from dramatiq import Broker

from benchmarks.common import NOOP, REDIS_URL, RUN_ID
from outbox import Abandoned, ActionAttempt, Done, Outbox, Result
from outbox.dispatch import broker_from_url

#: Where the adapter and the raw actor record what the scenario reads back.
STARTS_KEY = f"bench:{RUN_ID}:starts"
RAW_DONE_KEY = f"bench:{RUN_ID}:raw:done"
RAW_LATENCY_KEY = f"bench:{RUN_ID}:raw:latency"
#: The raw actor's queue (the outbox's is ``NOOP.queue_name``).
RAW_QUEUE = f"bench.raw.{RUN_ID}"
#: The outbox's actors run under a time limit of one lease; the raw actor gets the same.
TIME_LIMIT_MS = 5 * 60 * 1000


class NoopAdapter:
    """Passes the fence, then reports the effect done: all the outbox's own work, no effect."""

    def __init__(self, record_starts_to: str | None) -> None:
        self._redis_url = record_starts_to
        self._client: redis.asyncio.Redis | None = None

    async def execute(self, attempt: ActionAttempt) -> Result:
        if self._redis_url is not None:
            started = time.time()
            if self._client is None:
                self._client = redis.asyncio.Redis.from_url(self._redis_url)
            await self._client.hset(STARTS_KEY, str(attempt.id), repr(started))
        if not await attempt.fence().begin_write():
            return Abandoned()
        return Done(ref="noop")


@cache
def outbox_app() -> Outbox:
    """The outbox the claimer and the workers load (``OUTBOX_*`` settings from the scenario)."""
    outbox = Outbox()
    record = os.environ.get("BENCH_RECORD_STARTS") == "1"
    outbox.register(NOOP, NoopAdapter(outbox.settings.broker_url if record else None))
    return outbox


@cache
def _redis() -> redis.Redis:
    return redis.Redis.from_url(os.environ.get("OUTBOX_BROKER_URL", REDIS_URL))


def raw_noop(sent_at: float | None = None) -> None:
    """Counts itself done; with ``sent_at``, records how long after it was sent it started."""
    started = time.time()
    client = _redis()
    if sent_at is not None:
        client.rpush(RAW_LATENCY_KEY, repr(started - sent_at))
    client.incr(RAW_DONE_KEY)


@cache
def raw_broker() -> Broker:
    """``dramatiq benchmarks.apps:raw_broker``: the broker from ``OUTBOX_BROKER_URL`` with
    Dramatiq's default middleware (as the outbox's) and the one raw actor."""
    broker = broker_from_url(os.environ.get("OUTBOX_BROKER_URL", REDIS_URL))
    dramatiq.set_broker(broker)
    dramatiq.actor(
        raw_noop,
        actor_name="bench_raw_noop",
        queue_name=RAW_QUEUE,
        broker=broker,
        max_retries=0,
        time_limit=TIME_LIMIT_MS,
    )
    return broker
