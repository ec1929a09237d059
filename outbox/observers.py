"""Observers: what the executor reports, as hooks (as Dramatiq's ``Middleware`` does).

The executor reports each attempt's outcome, each end (housekeeping's too), each adapter error
and each message whose take was refused to a list of ``ExecutorObserver``s. Metrics
(``outbox.metrics.MetricsObserver``) and logs (``LogObserver``) are observers, installed by
``Outbox``; a new metric or log line is one observer, and the executor never changes for it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

from outbox.state import ActionState

if TYPE_CHECKING:
    from outbox.attempt import ActionAttempt
    from outbox.executor import Outcome
    from outbox.fence_token import FenceToken

log = logging.getLogger("outbox.executor")


class ExecutorObserver:
    """Hooks the executor calls, each a no-op here: override the ones you need.

    Hooks run on the executor's event loop right after what they report, so keep them quick and
    never block; an exception from one is logged and ignored (what it reports already happened).
    """

    def on_attempt(self, outcome: Outcome) -> None:
        """An attempt ran (or was abandoned at its fence) and its finish was written or not
        (``outcome.recorded``)."""

    def on_ended(self, action_id: int, kind: str, state: ActionState, reason: str) -> None:
        """An action ended: by an attempt's finish, or by housekeeping (a lost lease, an
        expiry)."""

    def on_adapter_error(self, attempt: ActionAttempt, error: Exception) -> None:
        """An adapter raised (or returned something that is not a result); before its fence
        this is a ``Retry``, after it (``attempt.fence_passed``) an ``Uncertain``."""

    def on_take_refused(self, kind: str, token: FenceToken) -> None:
        """A worker dropped a message: its epoch moved, its action ended, or another delivery
        of the same token took it first."""


class Observers:
    """The observers of one executor, called in order; one that raises never stops the rest."""

    def __init__(self, observers: Iterable[ExecutorObserver] = ()) -> None:
        self.observers = tuple(observers)

    def attempt(self, outcome: Outcome) -> None:
        for observer in self.observers:
            try:
                observer.on_attempt(outcome)
            except Exception:
                log.exception("observer %r failed in on_attempt", observer)

    def ended(self, action_id: int, kind: str, state: ActionState, reason: str) -> None:
        for observer in self.observers:
            try:
                observer.on_ended(action_id, kind, state, reason)
            except Exception:
                log.exception("observer %r failed in on_ended", observer)

    def adapter_error(self, attempt: ActionAttempt, error: Exception) -> None:
        for observer in self.observers:
            try:
                observer.on_adapter_error(attempt, error)
            except Exception:
                log.exception("observer %r failed in on_adapter_error", observer)

    def take_refused(self, kind: str, token: FenceToken) -> None:
        for observer in self.observers:
            try:
                observer.on_take_refused(kind, token)
            except Exception:
                log.exception("observer %r failed in on_take_refused", observer)


class LogObserver(ExecutorObserver):
    """The executor's log lines: one warning an UNCERTAIN end, one line an adapter error, one
    line a refused take. Exceptions by class only: their text may quote the payload."""

    def on_ended(self, action_id: int, kind: str, state: ActionState, reason: str) -> None:
        if state is ActionState.UNCERTAIN:
            log.warning(
                "action %s of kind %s ended UNCERTAIN: %s",
                action_id,
                kind,
                reason,
                extra={
                    "event": "uncertain",
                    "action_id": action_id,
                    "kind": kind,
                    "reason": reason,
                },
            )

    def on_adapter_error(self, attempt: ActionAttempt, error: Exception) -> None:
        if attempt.fence_passed:
            log.warning(
                "adapter of kind %s raised after its fence on action %s: %s",
                attempt.kind,
                attempt.id,
                type(error).__name__,
                extra=_error_fields("adapter_error_after_fence", attempt, error),
            )
        else:
            log.info(
                "adapter of kind %s raised before its fence on action %s: %s (retry)",
                attempt.kind,
                attempt.id,
                type(error).__name__,
                extra=_error_fields("adapter_error_before_fence", attempt, error),
            )

    def on_take_refused(self, kind: str, token: FenceToken) -> None:
        logging.getLogger("outbox.dispatch").info(
            "abandoned message for action %s epoch %s (kind %s): the epoch moved, "
            "the action ended, or another delivery took it",
            token.action_id,
            token.epoch,
            kind,
        )


def _error_fields(event: str, attempt: ActionAttempt, error: Exception) -> dict[str, object]:
    # The exception's class only: its text may quote the payload or an address.
    return {
        "event": event,
        "action_id": attempt.id,
        "kind": attempt.kind,
        "error": type(error).__name__,
    }
