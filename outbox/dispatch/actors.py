"""One Dramatiq actor per kind, joined to a broker by ``install``.

Each actor takes ``(action_id, epoch)``, or several such pairs flattened into one message
(``actions_per_message``; ``FenceToken.to_args`` / ``from_args``), and hands their tokens to the
process's ``WorkerRuntime``, which runs the core ``ActionExecutor`` (the code ``drain`` uses) on
each, the tokens of one message concurrently. The outbox owns retries, so Dramatiq never
retries a message; each kind has its own queue (``ActionKind.queue_name``), so each adapter can
be scaled by a worker pool of its own.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import dramatiq
from dramatiq import Actor, Broker, Message
from dramatiq.middleware import Middleware, TimeLimit

from outbox.dispatch.broker import default_broker
from outbox.dispatch.fabric import batches, deliver, even_chunks
from outbox.dispatch.health_watch import ConsumerHealth
from outbox.dispatch.pushing import broker_identity, check_broker
from outbox.dispatch.redis_push import LoopPush, push_pipelined
from outbox.dispatch.runtime import TIME_LIMIT_GRACE, WorkerRuntime, mark_delivery
from outbox.dispatch.wake import queue_counts, wake_consumers
from outbox.fence_token import BIGINT_MAX, FenceToken
from outbox.metrics import MetricsExposition

if TYPE_CHECKING:
    from outbox.outbox import Outbox

#: Dramatiq actor names: one per kind, e.g. ``outbox_email``.
ACTOR_PREFIX = "outbox_"

__all__ = ["ACTOR_PREFIX", "BIGINT_MAX", "Dispatch", "even_chunks", "install", "installed"]


@dataclass
class Dispatch:
    """What ``install`` joined to a broker: its actors (by kind name) and the worker runtime.
    The Dramatiq ``Fabric`` (``outbox.dispatch.fabric``)."""

    outbox: Outbox
    broker: Broker
    runtime: WorkerRuntime
    actors: dict[str, Actor[Any, Any]] = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        return sorted(self.actors)

    @property
    def queues(self) -> list[str]:
        return sorted(actor.queue_name for actor in self.actors.values())

    def check_broker(self) -> None:
        check_broker(self.broker)

    def broker_identity(self) -> str | None:
        return broker_identity(self.broker)

    def push_batch(self, kind: str, tokens: Sequence[FenceToken]) -> None:
        self._enqueue_and_wake([self.message(kind, tokens)])

    def message(self, kind: str, tokens: Sequence[FenceToken]) -> Message[Any]:
        """The message of ``tokens`` of one kind: its arguments are the tokens flattened
        (``FenceToken.to_args``), so a message of one action is exactly ``(action_id, epoch)``."""
        return self.actors[kind].message(*FenceToken.to_args(tokens))

    def messages(self, items: Iterable[tuple[str, FenceToken]]) -> list[Message[Any]]:
        """``(kind, token)`` items as messages of at most ``actions_per_message`` (``batches``)."""
        per_message = self.outbox.settings.actions_per_message
        return [self.message(kind, tokens) for kind, tokens in batches(items, per_message)]

    def push(self, kind: str, token: FenceToken) -> None:
        """Puts one ``(action_id, epoch)`` message on the kind's queue."""
        self._enqueue_and_wake([self.message(kind, [token])])

    def _enqueue_and_wake(self, messages: list[Message[Any]]) -> None:
        """Enqueues one at a time, then wakes idle consumers (``outbox.dispatch.wake``)."""
        for message in messages:
            self.broker.enqueue(message)
        wake_consumers(self.broker, queue_counts(messages))

    def push_many(self, items: Iterable[tuple[str, FenceToken]]) -> list[Message[Any]]:
        """Puts ``(kind, token)`` items on their queues, ``messages(items)`` of them:
        on Redis in one pipelined round trip (a round trip a message would be most of the
        claimer's work), elsewhere one message at a time. Returns the messages.

        Each message still goes through the broker's ``enqueue`` and its middleware. Raises if
        the round trip failed, and then none, some or all of the messages may have been queued:
        the caller may push them again (a twin delivery of an epoch is dropped by the worker's
        take) or leave them to their leases.
        """
        messages = self.messages(items)
        if not push_pipelined(self.broker, messages):
            self._enqueue_and_wake(messages)
        return messages

    def loop_push(self) -> LoopPush | None:
        """A pusher for the claimer's event loop (``outbox.dispatch.redis_push``), for a Redis
        broker the outbox made from its URL; None otherwise (pushes then go from a thread)."""
        return LoopPush.for_broker(self.broker, self.messages)


class OutboxRuntimeMiddleware(Middleware):
    """Opens the outbox's pool when a Dramatiq worker boots and closes it after it stopped;
    stops lane hand-offs when it begins to stop."""

    def __init__(self, runtime: WorkerRuntime) -> None:
        self.runtime = runtime

    def after_worker_boot(self, broker: Broker, worker: Any) -> None:
        self.runtime.start()

    def before_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        # The worker waits for the messages it runs: they hand no lane on meanwhile.
        self.runtime.stop_handing_off()

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        self.runtime.stop()


class DeliveryClock(Middleware):
    """Notes when a message begins, before Dramatiq's ``TimeLimit`` starts its clock
    (``outbox.dispatch.runtime.mark_delivery``): an attempt's deadline, and a lane hand-off's
    lease, count from then, and the time limit never cancels an attempt whose own lease holds.
    Measured at the actor's call instead, an overloaded process (seconds between Dramatiq's
    middleware and the actor's first line) cut attempts past their fence, and an email ended
    UNCERTAIN with its lease still running."""

    def before_process_message(self, broker: Broker, message: Any) -> None:
        mark_delivery()


def _add_delivery_clock(broker: Broker) -> None:
    """``DeliveryClock`` ahead of the broker's ``TimeLimit`` (or last, without one)."""
    if any(isinstance(m, DeliveryClock) for m in broker.middleware):
        return
    if any(isinstance(m, TimeLimit) for m in broker.middleware):
        broker.add_middleware(DeliveryClock(), before=TimeLimit)
    else:
        broker.add_middleware(DeliveryClock())


_installed: weakref.WeakKeyDictionary[Outbox, Dispatch] = weakref.WeakKeyDictionary()


def installed(outbox: Outbox) -> Dispatch | None:
    """The ``Dispatch`` that ``install`` made for ``outbox`` in this process, if any."""
    return _installed.get(outbox)


def actor_options(outbox: Outbox, broker: Broker) -> dict[str, Any]:
    """Never retried by Dramatiq (the outbox owns retries); time limit = the lease and
    ``TIME_LIMIT_GRACE``.

    The executor ends an attempt at its deadline: its lease by the database clock (started
    afresh by the take), and no later than ``lease`` after the message began (``DeliveryClock``
    notes when, before ``TimeLimit`` starts its clock). The time limit only frees a worker
    thread whose attempt outstayed its lease: it comes a grace later, so a loop that runs the
    executor's timeouts late (an overloaded process) still ends its attempts itself, each with
    its finish written, instead of Dramatiq cancelling one past its fence (an email then ends
    UNCERTAIN). Options the broker has no middleware for are left out, so a shop's broker
    without ``Retries`` or ``TimeLimit`` still takes the actors.
    """
    lease_ms = int(outbox.settings.lease.total_seconds() * 1000)
    options = {
        "max_retries": 0,
        "time_limit": lease_ms + int(TIME_LIMIT_GRACE.total_seconds() * 1000),
    }
    return {name: value for name, value in options.items() if name in broker.actor_options}


def _actor_fn(runtime: WorkerRuntime, kind: str) -> Callable[..., None]:
    def run_action(*args: Any) -> None:
        # A malformed message returns (is dropped by name): Dramatiq never retries it.
        deliver(runtime, kind, args)

    run_action.__name__ = f"{ACTOR_PREFIX}{kind.lower()}"
    run_action.__qualname__ = run_action.__name__
    return run_action


def install(
    outbox: Outbox, broker: Broker | None = None, *, kinds: Iterable[str] | None = None
) -> Dispatch:
    """Declares one actor per kind with an adapter (or per name in ``kinds``) on ``broker``.

    ``broker`` defaults to the one from ``OUTBOX_BROKER_URL``, else ``dramatiq.get_broker()`` if
    the application set one, else local Redis. Calling it again for the same outbox returns the
    first ``Dispatch``. The actors join the broker like any other, with its middleware, so an
    existing Dramatiq shop runs them with its own ``dramatiq`` command.
    """
    known = _installed.get(outbox)
    if known is not None:
        if broker is not None and broker is not known.broker:
            raise ValueError("this outbox is already installed on another broker")
        return known
    broker = broker or default_broker(outbox.settings.broker_url)
    runtime = WorkerRuntime(outbox)
    broker.add_middleware(OutboxRuntimeMiddleware(runtime))
    _add_delivery_clock(broker)
    if outbox.settings.metrics_port:
        # Under `dramatiq`, one forked process serves every worker process's metrics.
        broker.add_middleware(MetricsExposition())
    if outbox.settings.health_dir:
        # Each worker process's consumers feed its health file (and the pool's endpoint).
        broker.add_middleware(ConsumerHealth(outbox.settings))
    dispatch = Dispatch(outbox, broker, runtime)
    options = actor_options(outbox, broker)
    for name in sorted(kinds if kinds is not None else outbox.adapters):
        kind = outbox.kinds[name]
        dispatch.actors[name] = dramatiq.actor(
            actor_name=f"{ACTOR_PREFIX}{name.lower()}",
            queue_name=kind.queue_name,
            broker=broker,
            **options,
        )(_actor_fn(runtime, name))
    _installed[outbox] = dispatch
    return dispatch
