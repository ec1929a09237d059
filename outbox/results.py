"""What an adapter's ``execute`` returns. ``ActionExecutor`` maps each to a fenced finish."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


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
