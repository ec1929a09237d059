"""``FenceToken``: the name of one claim of one action, from the claim to its finish.

A claim raises the action's epoch; every later write of that attempt (the worker's take, the
fence, the finish) holds only while the action's epoch is still the token's. The token is what
a claimer pushes, a worker takes, a fence checks and a finish writes under.

On the wire (a Dramatiq message) tokens travel flattened, ``(action_id, epoch, action_id, epoch,
...)``: a message of one action is exactly ``(action_id, epoch)``. Queued messages must survive
an upgrade, so that form never changes; ``to_args`` and ``from_args`` are its only readers and
writers.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: An action id and an epoch are PostgreSQL bigints, and a claimed one's both start at 1.
BIGINT_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class FenceToken:
    """One claim of one action: ``(action_id, epoch)``. Hashable, so it keys a batch's rows."""

    action_id: int
    epoch: int

    @staticmethod
    def to_args(tokens: Iterable[FenceToken]) -> tuple[int, ...]:
        """Tokens as a message's arguments: ``(action_id, epoch)`` of each, flattened."""
        return tuple(value for token in tokens for value in (token.action_id, token.epoch))

    @staticmethod
    def from_args(args: Sequence[Any]) -> list[FenceToken]:
        """A message's arguments back as tokens (the inverse of ``to_args``).

        ValueError unless they are a non-empty, even-length list of ints (not bools) with every
        id and epoch in 1..2**63-1: a message some other code put on an outbox queue must never
        reach a statement shared with other messages.
        """
        if not args or len(args) % 2:
            raise ValueError(
                f"an outbox message holds (action_id, epoch) pairs, got {len(args)} values"
            )
        for value in args:
            if type(value) is not int or not 1 <= value <= BIGINT_MAX:
                raise ValueError(
                    "an outbox message holds (action_id, epoch) pairs of ints in 1..2**63-1, "
                    f"got a {type(value).__name__}"
                )
        return [FenceToken(a, e) for a, e in zip(args[::2], args[1::2], strict=True)]
