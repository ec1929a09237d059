"""What an adapter's ``execute`` returns, and the one finish each result writes.

``finish_for`` maps a result to a ``Finish``: everything the executor writes back for it, in one
epoch-fenced statement (``finish_many`` in ``sql/queries.sql``). A new result is its class here
and one case in ``finish_for``; the executor, the store and the SQL need no change.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, assert_never

from outbox.state import ActionState, StopReason

if TYPE_CHECKING:
    from outbox.action import Action
    from outbox.config import Settings


@dataclass(frozen=True, slots=True)
class Done:
    """The provider confirmed the effect. ``ref`` is the provider's reference (readback_ref)."""

    ref: str | None = None


@dataclass(frozen=True, slots=True)
class Retry:
    """The provider proved it holds nothing; a later try may succeed.

    ``after`` overrides the executor's capped exponential backoff with jitter.
    """

    after: timedelta | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Defer:
    """Not now, and nothing was written (a rate limit): the attempt is given back."""

    after: timedelta
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class Uncertain:
    """The effect may exist. The action ends UNCERTAIN and is never sent again."""

    reason: str


@dataclass(frozen=True, slots=True)
class Failed:
    """The provider refused it, or nobody can receive it."""

    reason: str


@dataclass(frozen=True, slots=True)
class Cancelled:
    """Nothing should be written."""

    reason: str


@dataclass(frozen=True, slots=True)
class Abandoned:
    """The fence refused: another holder owns the action, or it is gone. Nothing is written."""


Result = Done | Retry | Defer | Uncertain | Failed | Cancelled | Abandoned

RESULT_TYPES: tuple[type, ...] = (Done, Retry, Defer, Uncertain, Failed, Cancelled, Abandoned)


def result_name(result: Result) -> str:
    """The label used in metrics and logs: ``done``, ``retry``, ..."""
    return type(result).__name__.lower()


@dataclass(frozen=True, slots=True)
class Finish:
    """What one attempt writes back, only if its epoch still holds: an end or a wait.

    - An **end** (``state`` DONE, UNCERTAIN, FAILED or CANCELLED) sets ``stop_reason`` and
      ``readback_ref = ref``, drops the payload and sets ``ended_at``; ``retry_reason``, if given,
      replaces the last retry's reason (the cause of ATTEMPTS_EXHAUSTED), else that is kept.
    - A **wait** (``state`` ADMITTED) makes the action due again ``after`` from now with
      ``retry_reason``, clears its lease and fence, and gives the attempt back when
      ``gives_back_attempt`` (a deferral, or a retry during its provider's outage).
    - ``retried``: the adapter answered ``Retry`` (a wait, an end ATTEMPTS_EXHAUSTED, or an
      attempt given back during an outage): the finish adds the action to its kind's outage
      row (``outbox.provider_outage``).

    Neither ever drops the evidence of a write: an end keeps ``write_started_at``, and a wait
    moves it to ``earlier_write_at``, so a read-back adapter reads back first at every later
    attempt.
    """

    state: ActionState
    stop_reason: str | None = None
    ref: str | None = None
    retry_reason: str | None = None
    after: timedelta | None = None
    gives_back_attempt: bool = False
    #: The class name of the adapter's exception that led to this result, if any (the
    #: attempt's history keeps it; never the exception's text).
    error_class: str | None = None
    retried: bool = False

    def __post_init__(self) -> None:
        if self.state.is_ended:
            if self.stop_reason is None or self.after is not None or self.gives_back_attempt:
                raise ValueError(f"an end ({self.state}) needs a stop reason and no wait")
        elif self.state is ActionState.ADMITTED:
            if self.after is None or self.stop_reason is not None or self.ref is not None:
                raise ValueError("a wait needs `after` and has no stop reason or ref")
        else:
            raise ValueError(f"a finish ends the action or makes it wait, not {self.state}")

    @property
    def ends(self) -> bool:
        return self.state.is_ended

    @property
    def reason(self) -> str | None:
        """The stop reason of an end, the retry reason of a wait."""
        return self.stop_reason if self.ends else self.retry_reason


def backoff(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """Capped exponential backoff with jitter: base * 2^(attempt-1), capped, times 0.5..1."""
    exp = min(cap.total_seconds(), base.total_seconds() * 2 ** max(0, min(attempt - 1, 60)))
    return timedelta(seconds=exp * random.uniform(0.5, 1.0))


def finish_for(result: Result, action: Action, settings: Settings) -> Finish | None:
    """The one finish ``result`` writes for ``action``'s attempt; None for ``Abandoned`` (the
    fence refused: another holder owns the action, or it is gone)."""
    match result:
        case Done(ref=ref):
            return Finish(ActionState.DONE, StopReason.DONE, ref=ref)
        case Retry(after=after, reason=reason) if action.attempt < action.max_attempts:
            if after is None:
                after = backoff(action.attempt, settings.retry_base, settings.retry_cap)
            return Finish(ActionState.ADMITTED, retry_reason=reason, after=after, retried=True)
        case Retry(reason=reason):
            return Finish(
                ActionState.FAILED,
                StopReason.ATTEMPTS_EXHAUSTED,
                retry_reason=reason,
                retried=True,
            )
        case Defer(after=after, reason=reason):
            return Finish(
                ActionState.ADMITTED, retry_reason=reason, after=after, gives_back_attempt=True
            )
        case Uncertain(reason=reason):
            return Finish(ActionState.UNCERTAIN, reason)
        case Failed(reason=reason):
            return Finish(ActionState.FAILED, reason)
        case Cancelled(reason=reason):
            return Finish(ActionState.CANCELLED, reason)
        case Abandoned():
            return None
        case _:
            assert_never(result)
