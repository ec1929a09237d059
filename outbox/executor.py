"""``ActionExecutor``: the one place that calls an adapter's ``execute``.

It runs one claimed attempt, supervises it against its lease, maps the result to one
epoch-fenced finish, and reports what happened. ``outbox.testing.drain``, the Dramatiq actor and
the demo all use this class; there is no second copy of the mapping.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from outbox import metrics
from outbox.adapter import ActionAdapter
from outbox.attempt import ActionAttempt
from outbox.config import Settings
from outbox.errors import TransactionOpenError
from outbox.results import (
    RESULT_TYPES,
    Abandoned,
    Cancelled,
    Defer,
    Done,
    Failed,
    Result,
    Retry,
    Uncertain,
    result_name,
)
from outbox.state import ActionState, StopReason
from outbox.store import ClaimedAction, Store, held_connections

if TYPE_CHECKING:
    from outbox.maintenance.ended import EndedByHousekeeping

log = logging.getLogger("outbox.executor")

#: A claimed action of a kind without an adapter in this process goes back to wait this long
#: (its attempt given back), so a process with the adapter can take it.
NO_ADAPTER_DEFER = timedelta(seconds=30)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one attempt came to. ``recorded`` is False when its fenced finish found the epoch
    moved (or the row gone) and so changed nothing. ``state`` is the state it wrote, if any."""

    action_id: int
    kind: str
    epoch: int
    result: Result
    recorded: bool
    state: ActionState | None
    reason: str | None = None


def backoff(attempt: int, base: timedelta, cap: timedelta) -> timedelta:
    """Capped exponential backoff with jitter: base * 2^(attempt-1), capped, times 0.5..1."""
    exp = min(cap.total_seconds(), base.total_seconds() * 2 ** max(0, min(attempt - 1, 60)))
    return timedelta(seconds=exp * random.uniform(0.5, 1.0))


class ActionExecutor:
    def __init__(
        self, store: Store, adapters: Mapping[str, ActionAdapter], settings: Settings
    ) -> None:
        self.store = store
        self.adapters = adapters
        self.settings = settings

    async def run(self, claimed: ClaimedAction, claimed_at: float) -> Outcome:
        """Runs one attempt. ``claimed_at`` is ``time.monotonic()`` taken before the statement
        that claimed or loaded it, so the local deadline never outlives the database lease."""
        action = claimed.action
        deadline = claimed_at + claimed.lease_left.total_seconds()
        adapter = self.adapters.get(action.kind)
        if adapter is None:
            log.error(
                "no adapter for kind %s in this process: action %s given back",
                action.kind,
                action.id,
                extra={"event": "no_adapter", "action_id": action.id, "kind": action.kind},
            )
            return await self._finish(
                action.id,
                action.kind,
                action.epoch,
                action.attempt,
                action.max_attempts,
                Defer(NO_ADAPTER_DEFER, "NO_ADAPTER"),
            )
        attempt = ActionAttempt(action, self.store, self.settings.write_margin, deadline)
        result = await self._execute(adapter, attempt)
        return await self._finish(
            action.id, action.kind, action.epoch, action.attempt, action.max_attempts, result
        )

    async def _execute(self, adapter: ActionAdapter, attempt: ActionAttempt) -> Result:
        if held_connections.get():
            raise TransactionOpenError(
                f"refusing to run the {attempt.kind} adapter while holding a database connection"
            )
        margin = self.settings.write_margin.total_seconds()
        # The adapter runs in this task under a timeout, not in a task and a wait of its own (a
        # few futures and callbacks an attempt on the worker's loop). Until the fence passes,
        # the attempt is useful only while the fence could pass; passing it moves the timeout
        # to the lease's end.
        to_loop = asyncio.get_running_loop().time() - time.monotonic()
        scope = asyncio.timeout_at(attempt.deadline - margin + to_loop)

        def fence_passed() -> None:
            if not scope.expired():
                scope.reschedule(attempt.deadline + to_loop)

        attempt.on_fence_passed = fence_passed
        try:
            async with scope:
                result = await adapter.execute(attempt)
        except TimeoutError as error:
            if not scope.expired():  # the adapter's own, not the lease's
                return self._error_result(attempt, error)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            return self._error_result(attempt, error)
        if scope.expired():
            # Also when the adapter swallowed the cancellation and returned: it ran out of time.
            if attempt.fence_passed:
                return Uncertain(StopReason.LEASE_EXPIRED_DURING_WRITE)
            return Retry(reason="LEASE_RAN_OUT_BEFORE_WRITE")
        if not isinstance(result, RESULT_TYPES):
            return self._error_result(
                attempt, TypeError(f"adapter returned {result!r}, not an outbox result")
            )
        return result

    def _error_result(self, attempt: ActionAttempt, error: Exception) -> Result:
        """An adapter's exception: Uncertain after its fence, Retry before it."""
        if attempt.fence_passed:
            log.warning(
                "adapter of kind %s raised after its fence on action %s: %s",
                attempt.kind,
                attempt.id,
                type(error).__name__,
                extra=_error_fields("adapter_error_after_fence", attempt, error),
            )
            return Uncertain(StopReason.ADAPTER_ERROR_AFTER_WRITE)
        log.info(
            "adapter of kind %s raised before its fence on action %s: %s (retry)",
            attempt.kind,
            attempt.id,
            type(error).__name__,
            extra=_error_fields("adapter_error_before_fence", attempt, error),
        )
        return Retry(reason=f"ERROR:{type(error).__name__}")

    async def _finish(
        self,
        action_id: int,
        kind: str,
        epoch: int,
        attempt: int,
        max_attempts: int,
        result: Result,
    ) -> Outcome:
        store = self.store
        state: ActionState | None
        reason: str | None
        match result:
            case Done(ref=ref):
                state, reason = ActionState.DONE, StopReason.DONE
                recorded = await store.finish_end(action_id, epoch, state, reason, ref)
            case Retry(after=after) if attempt < max_attempts:
                state, reason = ActionState.ADMITTED, result.reason
                wait = (
                    after
                    if after is not None
                    else backoff(attempt, self.settings.retry_base, self.settings.retry_cap)
                )
                recorded = await store.finish_retry(action_id, epoch, wait, result.reason)
            case Retry():
                state, reason = ActionState.FAILED, StopReason.ATTEMPTS_EXHAUSTED
                recorded = await store.finish_end(
                    action_id, epoch, state, reason, None, cause=result.reason
                )
            case Defer(after=after):
                state, reason = ActionState.ADMITTED, result.reason
                recorded = await store.finish_defer(action_id, epoch, after, result.reason)
            case Uncertain(reason=reason):
                state = ActionState.UNCERTAIN
                recorded = await store.finish_end(action_id, epoch, state, reason, None)
            case Failed(reason=reason):
                state = ActionState.FAILED
                recorded = await store.finish_end(action_id, epoch, state, reason, None)
            case Cancelled(reason=reason):
                state = ActionState.CANCELLED
                recorded = await store.finish_end(action_id, epoch, state, reason, None)
            case Abandoned():
                state, reason, recorded = None, None, False
            case _:  # pragma: no cover - _execute only returns results
                raise TypeError(f"not a result: {result!r}")
        metrics.record_attempt(kind, result_name(result), recorded)
        if recorded and state is not None and state.is_ended:
            report_ended(action_id, kind, state, reason or "")
        return Outcome(
            action_id, kind, epoch, result, recorded, state if recorded else None, reason
        )


def _error_fields(event: str, attempt: ActionAttempt, error: Exception) -> dict[str, object]:
    # The exception's class only: its text may quote the payload or an address.
    return {
        "event": event,
        "action_id": attempt.id,
        "kind": attempt.kind,
        "error": type(error).__name__,
    }


def report_ended(action_id: int, kind: str, state: ActionState, reason: str) -> None:
    """Counts an end; an UNCERTAIN end also writes its one warning line."""
    metrics.record_ended(kind, state.value, reason)
    if state is ActionState.UNCERTAIN:
        log.warning(
            "action %s of kind %s ended UNCERTAIN: %s",
            action_id,
            kind,
            reason,
            extra={"event": "uncertain", "action_id": action_id, "kind": kind, "reason": reason},
        )


def report_housekeeping(ended: list[EndedByHousekeeping]) -> None:
    for item in ended:
        report_ended(item.id, item.kind, item.state, item.reason)
