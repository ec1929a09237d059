"""Pushing a claim round's messages to a Redis broker in one round trip.

Dramatiq's ``RedisBroker.enqueue`` runs its dispatch script once a message, a round trip each,
which would be most of the claimer's work. Here each message still goes through the broker's
``enqueue`` (its middleware's enqueue hooks included), but the script call it makes is captured
(``dispatch_calls``) and sent with the others, and with the wake tokens of the queues they go to
(``outbox.dispatch.wake``), in one pipeline:

- ``push_pipelined``: on the broker's own (blocking) client, from a thread (``OffLoop``);
- ``LoopPush``: on an asyncio client on the claimer's event loop, for a broker the outbox made
  from its URL (``broker_from_url``). A push off the loop crosses to a thread and back, which
  was about half of a one-message push's time on an idle pool (0.55 against 0.23 ms
  measured in one process); on the loop there is no hop, and ``push_timeout`` still bounds the
  push (the claimer's ``asyncio.wait_for``).

The scripts run by their hash alone: a pipeline that registers a script asks Redis whether it
knows it first (``SCRIPT EXISTS``), a round trip of its own on every push. A Redis that lost its
scripts (a restart, ``SCRIPT FLUSH``) refuses every ``EVALSHA`` of the pipeline alike, so none
of its messages went: the script is loaded again and the pipeline sent once more (a twin message
of an epoch, should one have gone after all, is dropped by the worker's take).

Relies on ``RedisBroker``'s internals (its ``dispatch`` script and ``_dispatch``, as of
Dramatiq 2.x); any other broker, or a version without them, gets None from ``dispatch_calls``
and the fabric pushes one message at a time.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import redis.asyncio
from dramatiq import Broker, Message
from dramatiq.brokers.redis import RedisBroker
from redis.exceptions import NoScriptError

from outbox.dispatch.wake import WakingRedisBroker, queue_counts, wake_consumers
from outbox.fence_token import FenceToken

#: One dispatch script call: its keys and its arguments.
DispatchCall = tuple[list[Any], list[Any]]


def dispatch_calls(broker: Broker, messages: Sequence[Message[Any]]) -> list[DispatchCall] | None:
    """Each message enqueued through ``broker.enqueue`` on a view of the broker whose dispatch
    script is captured instead of called: the script calls that would have queued them, in
    order. None for a broker that is not a ``RedisBroker`` of the internals this knows."""
    if not isinstance(broker, RedisBroker):
        return None
    calls: list[DispatchCall] = []

    def capture(keys: list[Any], args: list[Any]) -> None:
        calls.append((list(keys), list(args)))

    try:
        view: Any = copy.copy(broker)  # internals the stubs do not declare
        view.scripts = {**broker.scripts, "dispatch": capture}
        view.do_enqueue = view._dispatch("enqueue")
    except (AttributeError, KeyError, TypeError):
        return None
    for message in messages:
        view.enqueue(message)
    return calls


@dataclass(frozen=True)
class _Push:
    """One push, ready for either client's pipeline: the dispatch script, its captured calls
    and the wake tokens the messages need."""

    broker: RedisBroker
    script: Any
    calls: list[DispatchCall]
    counts: dict[str, int]

    @classmethod
    def of(cls, broker: Broker, messages: list[Message[Any]]) -> _Push | None:
        calls = dispatch_calls(broker, messages)
        if calls is None:
            return None
        assert isinstance(broker, RedisBroker)
        return cls(broker, broker.scripts["dispatch"], calls, queue_counts(messages))

    def queue(self, pipe: Any) -> None:
        """The script calls, then the wake tokens of the messages they announce, on ``pipe``."""
        for keys, args in self.calls:
            pipe.evalsha(self.script.sha, len(keys), *keys, *args)
        wake_consumers(self.broker, self.counts, pipe)


def push_pipelined(broker: Broker, messages: list[Message[Any]]) -> bool:
    """Enqueues ``messages`` and their wake tokens in one round trip of the broker's own client
    (blocking); False, with nothing sent, for a broker ``dispatch_calls`` does not know."""
    push = _Push.of(broker, messages)
    if push is None:
        return False
    script = push.script
    for _ in range(2):
        with push.broker.client.pipeline(transaction=False) as pipe:
            push.queue(pipe)
            try:
                pipe.execute()
                return True
            except NoScriptError:
                script.sha = push.broker.client.script_load(script.script)
    # Refused twice in a row (scripts flushed again at once): as a failed round trip.
    raise NoScriptError("the dispatch script was not loaded")


#: ``(kind, token)`` items as the messages that carry them (``Dispatch.messages``).
MessagesOf = Callable[[Iterable[tuple[str, FenceToken]]], list[Message[Any]]]


class LoopPush:
    """Pushes on the event loop it is first used on, over an asyncio Redis client of the
    broker's URL (opened at the first push; ``aclose`` closes it). The claimer's
    ``LoopPusher`` (``outbox.dispatch.fabric``)."""

    def __init__(self, broker: WakingRedisBroker, url: str, messages_of: MessagesOf) -> None:
        self.broker = broker
        self.url = url  # the broker's (``for_broker``), known to be set
        self.messages_of = messages_of
        self._client: redis.asyncio.Redis | None = None

    @classmethod
    def for_broker(cls, broker: Broker, messages_of: MessagesOf) -> LoopPush | None:
        """A ``LoopPush`` for a Redis broker ``broker_from_url`` made (it knows the URL and
        the client's timeouts); None for any other broker, which is pushed from a thread."""
        if isinstance(broker, WakingRedisBroker) and broker.url is not None:
            return cls(broker, broker.url, messages_of)
        return None

    def _redis(self) -> redis.asyncio.Redis:
        if self._client is None:
            from outbox.dispatch.broker import REDIS_CONNECT_TIMEOUT, REDIS_SOCKET_TIMEOUT

            self._client = redis.asyncio.Redis.from_url(
                self.url,
                socket_connect_timeout=REDIS_CONNECT_TIMEOUT,
                socket_timeout=REDIS_SOCKET_TIMEOUT,
            )
        return self._client

    async def push_many(self, items: Iterable[tuple[str, FenceToken]]) -> None:
        """Enqueues ``(kind, token)`` items, as ``Dispatch.push_many`` does, and their wake
        tokens, in one round trip. Raises if it failed, and then none, some or all of them may
        have been queued (a twin delivery of an epoch is dropped by the worker's take)."""
        push = _Push.of(self.broker, self.messages_of(items))
        if push is None:  # pragma: no cover - for_broker took a RedisBroker
            raise TypeError("not a Redis broker of the internals dispatch_calls knows")
        client = self._redis()
        for _ in range(2):
            async with client.pipeline(transaction=False) as pipe:
                push.queue(pipe)
                try:
                    await pipe.execute()
                    return
                except NoScriptError:
                    await client.script_load(push.script.script)
        raise NoScriptError("the dispatch script was not loaded")

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()
