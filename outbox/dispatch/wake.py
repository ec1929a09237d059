"""Wake-ups for idle Redis consumers: a push reaches a waiting worker at once, not after a poll.

Dramatiq's Redis consumer finds an empty queue by asking, then sleeps a backoff that doubles up
to ``worker_timeout`` (1 s by default) before it asks again. An idle pool thus answers a push
after half a backoff on average: hundreds of ms at the default, and a pool run at a short
``worker_timeout`` to avoid that pays for it in CPU (each of its worker threads also wakes every
``worker_timeout``: at 10 ms, 64 idle threads cost half a core).

The outbox's own Redis broker (``WakingRedisBroker``, what ``OUTBOX_BROKER_URL`` builds) waits
differently: a consumer that found its queue empty, or took fewer messages than it asked for,
blocks on its queue's wake list (``BLPOP``) for the whole ``worker_timeout``, and whatever pushes
for the outbox (``wake_consumers``, in the claimer's push pipeline) adds a token there, one a
message. The token stays until a consumer pops it, so a push made while no consumer waits is not
lost: the next wait returns at once. A message pushed without one (another client, a requeue of
a dead worker's messages) is found by the look after the wait, at most ``worker_timeout`` later,
as by an idle Dramatiq consumer (its backoff reaches that bound after a few empty looks).

Relies on ``_RedisConsumer`` and ``RedisBroker.do_fetch`` (Dramatiq 2.x); without them the URL
gives a plain ``RedisBroker`` (``waking_redis_broker_class``), which polls.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import redis
from dramatiq import Broker, Message
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker
from dramatiq.common import compute_backoff
from dramatiq.errors import ConnectionClosed

#: Tokens kept on a wake list: a busy pool pops none, so a burst's tokens are trimmed to this
#: many (each spare one costs an idle consumer one empty fetch).
WAKE_KEEP = 16
#: A wake list nobody popped expires (a pool that is gone leaves no keys behind).
WAKE_TTL_MS = 60_000
#: Longest single wait on a wake list, below the Redis client's socket timeout (10 s), so a
#: blocked consumer never reads as a stalled socket, whatever ``worker_timeout`` says.
MAX_WAKE_WAIT = 5.0
#: A consumer with as many messages outstanding as it may prefetch fetches nothing, so no wake
#: is for it; it looks again after at most this many ms (as with a short ``worker_timeout``).
FULL_BACKOFF_MS = 10


def wake_key(namespace: str, queue_name: str) -> str:
    """The wake list of a queue, beside Dramatiq's own keys of that namespace."""
    return f"{namespace}:__outbox_wake__.{queue_name}"


def wake_consumers(broker: Broker, queue_counts: dict[str, int], client: Any = None) -> None:
    """Adds one wake token a message pushed to each queue of ``queue_counts`` (queue -> how
    many), on ``client`` (a pipeline, so the tokens go in the push's round trip) or the
    broker's. Nothing for a broker whose consumers do not wait on wake lists."""
    if not isinstance(broker, WakingRedisBroker):
        return
    pipe = client if client is not None else broker.client.pipeline(transaction=False)
    for queue_name, count in queue_counts.items():
        if count <= 0:
            continue
        key = wake_key(broker.namespace, queue_name)
        pipe.rpush(key, *["1"] * min(count, WAKE_KEEP))
        pipe.ltrim(key, -WAKE_KEEP, -1)
        pipe.pexpire(key, WAKE_TTL_MS)
    if client is None:
        pipe.execute()


def queue_counts(messages: Iterable[Message[Any]]) -> dict[str, int]:
    """How many of ``messages`` go to each queue."""
    counts: dict[str, int] = {}
    for message in messages:
        counts[message.queue_name] = counts.get(message.queue_name, 0) + 1
    return counts


def waking_redis_broker_class() -> type[RedisBroker]:
    """``WakingRedisBroker``, or plain ``RedisBroker`` where Dramatiq's internals differ."""
    return WakingRedisBroker if _WakingConsumer is not None else RedisBroker


try:
    from dramatiq.brokers.redis import _RedisConsumer
except ImportError:  # pragma: no cover - another Dramatiq layout: plain polling
    _WakingConsumer: type[Any] | None = None
else:

    class _WakingConsumerImpl(_RedisConsumer):
        """Dramatiq's Redis consumer whose idle wait ends early on a wake token."""

        def __init__(self, broker: Any, queue_name: str, prefetch: int, timeout: int) -> None:
            super().__init__(broker, queue_name, prefetch, timeout)
            self.wake_key = wake_key(broker.namespace, queue_name)
            #: The last fetch found the queue empty or got fewer messages than it asked for:
            #: what comes next comes with a token, so the next look waits for one first.
            self.drained = False

        def __next__(self) -> MessageProxy | None:
            # Dramatiq's own __next__ (2.x) but for the wait after an empty fetch.
            try:
                while True:
                    if self.message_cache:
                        data = self.message_cache.pop(0)
                        if data is None:
                            continue
                        self.misses = 0
                        message = Message.decode(data)
                        self.queued_message_ids.add(message.message_id)
                        return MessageProxy(message)
                    if not self._fetch_or_wait():
                        return None
            except redis.ConnectionError as error:
                raise ConnectionClosed(error) from None

        def _fetch_or_wait(self) -> bool:
            """Fetches what the prefetch allows (True if anything came), unless the last fetch
            drained the queue; else waits, for a wake token or the timeout, and returns False,
            as Dramatiq's consumer after its sleep."""
            room = self.prefetch - self.outstanding_message_count
            if room <= 0:
                self.misses, backoff_ms = compute_backoff(
                    self.misses, max_backoff=min(self.timeout, FULL_BACKOFF_MS)
                )
                time.sleep(backoff_ms / 1000)
                return False
            if not self.drained:
                self.message_cache = self.broker.do_fetch(self.queue_name, room)
                # Fewer than asked for: the queue was empty at the fetch (a fetch a message,
                # in a pool that runs a message every few ms, was a fourth of its Redis calls).
                self.drained = len(self.message_cache) < room
                if self.message_cache:
                    return True
            # The whole timeout at once, not Dramatiq's backoff from 5 ms: a push comes with a
            # token, and the backoff's short waits cost an idle consumer of a pool that runs
            # a message every few tens of ms a fetch and a wait each (a third of its CPU).
            # BLPOP's timeout 0 would block for ever: wait at least a millisecond.
            wait = min(max(self.timeout, 1) / 1000, MAX_WAKE_WAIT)
            if self.broker.client.blpop([self.wake_key], timeout=wait) is not None:
                # Woken: the next call fetches at once, with no backoff carried over.
                self.misses = 0
            # Woken or not, the next call fetches: after a timeout it finds what came without
            # a token.
            self.drained = False
            return False

    _WakingConsumer = _WakingConsumerImpl


class WakingRedisBroker(RedisBroker):
    """A ``RedisBroker`` whose consumers wait on their queue's wake list when idle."""

    #: The URL ``broker_from_url`` made it from: the claimer pushes over an asyncio client of
    #: the same URL on its event loop (``outbox.dispatch.redis_push``).
    url: str | None = None

    @property
    def consumer_class(self) -> Any:
        return _WakingConsumer or super().consumer_class
