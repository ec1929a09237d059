"""What a dispatch fabric is: the only part of dispatch that differs between Dramatiq and Celery.

The claimer (bound, claim, give-back, consumption watch), the worker runtime (take once per
epoch, the executor, group commit) and the message format are shared. A fabric adds five things:

- ``push_many`` / ``push_batch``: put ``(action_id, epoch)`` pairs on a kind's queue, as
  messages of at most ``actions_per_message`` pairs (``batches``); ``loop_push``, where the
  broker has an asyncio client, does what ``push_many`` does from the claimer's event loop;
- a worker-side entry (a Dramatiq actor, a Celery task) that hands a message's arguments to
  ``deliver``, which parses them and runs them through the process's ``WorkerRuntime``;
- ``check_broker``: whether the broker answers, for the claimer's ``BrokerGate``;
- ``broker_identity``: which run of the broker answers, for the claimer's ``RestartWatch``;
- ``kinds`` / ``queues``: what it carries.

Whether workers consume what is pushed is read from PostgreSQL (a claim whose lease ran out
untaken, ``consumption``), so no fabric has to report it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from outbox.config import FABRICS
from outbox.fence_token import FenceToken
from outbox.metrics import record_malformed_message

if TYPE_CHECKING:
    from outbox.dispatch.runtime import WorkerRuntime
    from outbox.outbox import Outbox

log = logging.getLogger("outbox.dispatch")

__all__ = ["FABRICS", "Batch", "Fabric", "LoopPusher", "batches", "deliver", "even_chunks"]

T = TypeVar("T")

#: A message's content: a kind and the tokens it carries.
Batch = tuple[str, list[FenceToken]]


class LoopPusher(Protocol):
    """Pushes from the claimer's event loop, without a thread (``Fabric.loop_push``)."""

    async def push_many(self, items: Iterable[tuple[str, FenceToken]]) -> None:
        """As ``Fabric.push_many``; the claimer bounds it with ``push_timeout``."""
        ...

    async def aclose(self) -> None:
        """Closes its connections (the claimer's run ends)."""
        ...


class Fabric(Protocol):
    """A broker and its worker entry, as the claimer sees them."""

    @property
    def outbox(self) -> Outbox: ...

    @property
    def kinds(self) -> list[str]:
        """The kinds it has a worker entry for (sorted)."""
        ...

    @property
    def queues(self) -> list[str]: ...

    def push_many(self, items: Iterable[tuple[str, FenceToken]]) -> object:
        """Pushes ``batches(items)``. Raises if the broker failed, and then none, some or all
        of them may have been queued (a twin delivery of an epoch is dropped by the take)."""
        ...

    def loop_push(self) -> LoopPusher | None:
        """A pusher for the claimer's event loop, where the broker has an asyncio client;
        None: the claimer pushes with ``push_many`` on a thread."""
        ...

    def push_batch(self, kind: str, tokens: Sequence[FenceToken]) -> None:
        """Pushes one message of ``tokens`` of ``kind``; raises if the broker failed."""
        ...

    def check_broker(self) -> None:
        """Raises unless the broker answers. Blocking (the claimer runs it on a thread)."""
        ...

    def broker_identity(self) -> str | None:
        """Which run of the broker answers (a Redis ``run_id``); None where a restart loses no
        message, or the broker cannot say. Blocking (the claimer runs it on a thread)."""
        ...


def batches(items: Iterable[tuple[str, FenceToken]], per_message: int) -> list[Batch]:
    """``(kind, token)`` items as messages' contents: per kind, in chunks of at most
    ``per_message`` of even size (7 actions at 4 a message go 4 + 3, 9 go 3 + 3 + 3), so a
    round's work spreads over as many messages as it needs and no more."""
    by_kind: dict[str, list[FenceToken]] = {}
    for kind, token in items:
        by_kind.setdefault(kind, []).append(token)
    return [
        (kind, list(chunk))
        for kind, tokens in by_kind.items()
        for chunk in even_chunks(tokens, per_message)
    ]


def even_chunks(items: Sequence[T], most: int) -> Iterator[Sequence[T]]:
    """``items`` in the fewest chunks of at most ``most``, their sizes differing by one at most."""
    if not items:
        return
    count = -(-len(items) // most)
    size, larger = divmod(len(items), count)
    start = 0
    for index in range(count):
        end = start + size + (1 if index < larger else 0)
        yield items[start:end]
        start = end


def deliver(runtime: WorkerRuntime, kind: str, args: Sequence[Any]) -> None:
    """The worker side of every fabric: a message's arguments (``(action_id, epoch)`` pairs,
    flattened) run through the process's runtime; anything else is dropped by name.

    Returns normally for a malformed message (so no fabric retries it); raises what the
    runtime raised (a database error: the action is left to its lease).
    """
    try:
        tokens = FenceToken.from_args(args)
    except ValueError:
        # Not the claimer's: dropped here, before its values reach a statement shared with
        # other messages.
        record_malformed_message(kind)
        log.error(
            "dropped a malformed message for kind %s: %s values of types %s "
            "(wanted (action_id, epoch) pairs of ints in 1..2**63-1)",
            kind,
            len(args),
            sorted({type(value).__name__ for value in args}),
        )
        return
    if len(tokens) > 1:
        runtime.run_many(kind, tokens)
    else:
        runtime.run(kind, tokens[0])
