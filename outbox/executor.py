"""``ActionExecutor``: the one place that calls an adapter's ``execute``.

It runs one claimed attempt, supervises it against its lease, maps the result to one
epoch-fenced finish, and reports what happened. ``outbox.testing.drain``, the Dramatiq actor and
the demo all use this class; there is no second copy of the mapping.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from outbox.action import Action
from outbox.adapter import ActionAdapter
from outbox.attempt import ActionAttempt
from outbox.config import Settings
from outbox.errors import TransactionOpenError
from outbox.fence_token import FenceToken
from outbox.lease_timer import LeaseClock, LeaseTimer, lease_end_lead
from outbox.limits import RATE_HORIZON, KindLimits
from outbox.observers import ExecutorObserver, Observers
from outbox.outage import OUTAGE, sent_again
from outbox.provider_outage import exhausts_on_retry, ride_out
from outbox.rate_limiter import MAX_SLOT_WAIT, SLOT_LEAD, RateLimiter, Slot
from outbox.results import RESULT_TYPES, Defer, Result, Retry, Uncertain, finish_for
from outbox.state import ActionState, StopReason
from outbox.store import ClaimedAction, Store, held_connections

if TYPE_CHECKING:
    from outbox.maintenance.ended import EndedByHousekeeping

log = logging.getLogger("outbox.executor")

#: The retry reason of an action deferred by its rate limit (its slot was too far away).
RATE_LIMITED = "RATE_LIMITED"
#: Shortest deferral for a slot, in seconds: the slot may be held by a provider's pause that
#: ends any moment, and a deferral of nothing would spin.
MIN_DEFER = 0.05

#: How often a fence that missed its slot reserves a fresh one before it goes anyway, and how
#: far away that slot may be, in seconds (past the fence an action cannot be deferred any more).
LATE_TRIES = 3
LATE_SLOT_WAIT = 2 * RATE_HORIZON

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
    #: The lane's next action, claimed and taken by this attempt's finish (the lane hand-off,
    #: ``ActionExecutor.run``'s ``hand_off``), for the caller to run next; and
    #: ``time.monotonic()`` taken before that finish (its ``claimed_at``).
    next: ClaimedAction | None = None
    next_claimed_at: float = 0.0

    @property
    def token(self) -> FenceToken:
        return FenceToken(self.action_id, self.epoch)


class ActionExecutor:
    """Runs claimed attempts: the adapter under its lease, then the result's one finish.

    ``observers`` hear of every attempt, end and adapter error (``outbox.observers``):
    ``Outbox.executor`` passes the outbox's; None means the default ones (metrics, then logs).
    ``read_back_kinds`` names the kinds that can find an earlier write (not at-most-once): an
    attempt of theirs cut short after its fence is retried, and the retry reads back first.
    Any other kind's such attempt ends UNCERTAIN.
    """

    def __init__(
        self,
        store: Store,
        adapters: Mapping[str, ActionAdapter],
        settings: Settings,
        observers: Iterable[ExecutorObserver] | None = None,
        kind_limits: Mapping[str, KindLimits] | None = None,
        read_back_kinds: Collection[str] = frozenset(),
    ) -> None:
        self.store = store
        self.read_back_kinds = frozenset(read_back_kinds)
        self.adapters = adapters
        self.settings = settings
        self.observers = Observers(_default_observers() if observers is None else observers)
        #: The shared slots of the rate-limited kinds (``outbox.rate_limiter``).
        self.limiter = RateLimiter(store, kind_limits or {})
        self._clock: LeaseClock | None = None

    async def run(
        self, claimed: ClaimedAction, claimed_at: float, *, hand_off: timedelta | None = None
    ) -> Outcome:
        """Runs one attempt. ``claimed_at`` is ``time.monotonic()`` taken before the statement
        that claimed or loaded it, so the local deadline never outlives the database lease.
        With ``hand_off`` (a lease), an end of the attempt also claims and takes the lane's
        next action when it may (``Store.finish_and_hand_off``): ``Outcome.next``."""
        action = claimed.action
        deadline = claimed_at + claimed.lease_left.total_seconds()
        attempt = ActionAttempt(
            action, self.store, self.settings.write_margin, deadline, self._claimed_at(action)
        )
        adapter = self.adapters.get(action.kind)
        if adapter is None:
            log.error(
                "no adapter for kind %s in this process: action %s given back",
                action.kind,
                action.id,
                extra={"event": "no_adapter", "action_id": action.id, "kind": action.kind},
            )
            return await self._finish(attempt, Defer(NO_ADAPTER_DEFER, "NO_ADAPTER"), hand_off)
        if self.limiter.rated(action.kind):
            waited = await self._wait_for_slot(attempt)
            if waited is not None:
                return await self._finish(attempt, waited, hand_off)
        result = await self._execute(adapter, attempt)
        if isinstance(result, Defer):
            # A provider's pause (429, Retry-After) holds the kind's (and key's) slots for every
            # worker, not only this action.
            await self.limiter.hold(action, result.after)
        return await self._finish(attempt, result, hand_off)

    async def _wait_for_slot(self, attempt: ActionAttempt) -> Defer | None:
        """An attempt of a rate-limited kind: reserves the action's slot and sleeps until just
        before it (None), or, when the slot is further away than this attempt may wait, the
        deferral until about then. The fence then waits out the rest (``_on_time``)."""
        margin = self.settings.write_margin.total_seconds()
        # The adapter still needs its write margin after the wait, and a second to spare.
        may_wait = max(0.0, min(MAX_SLOT_WAIT.total_seconds(), attempt.time_left() - margin - 1))
        slot = await self.limiter.reserve(attempt.action, timedelta(seconds=may_wait))
        if slot is None:
            return None
        if not slot.reserved:
            return Defer(timedelta(seconds=max(slot.wait, MIN_DEFER)), RATE_LIMITED)
        early = slot.at - SLOT_LEAD - time.monotonic()
        if early > 0:
            await asyncio.sleep(early)
        # Given the attempt when called, not holding it: that would be a reference cycle.
        attempt.before_write = functools.partial(self._on_time, slot=slot)
        return None

    async def _on_time(self, attempt: ActionAttempt, slot: Slot) -> None:
        """After the fence passed: waits for the slot, then makes sure the call is not more than
        the limit's tolerance late (late calls bunch up with the next ones at the provider): a
        fence, a reservation's answer or a busy event loop that made it later reserves a fresh
        slot and waits for that (a few tries; then it goes late). The last look at the clock is
        right before returning to the adapter, which calls the provider at once."""
        tolerance = self.limiter.tolerance(attempt.action)
        margin = self.settings.write_margin.total_seconds()
        for _ in range(LATE_TRIES):
            left = slot.at - time.monotonic()
            if left > 0:
                await asyncio.sleep(left)
            if time.monotonic() - slot.earliest <= tolerance:
                return
            # Past the fence the write margin belongs to the provider call: a fresh slot only
            # within what the lease leaves beyond it.
            budget = min(LATE_SLOT_WAIT, attempt.time_left() - margin)
            fresh = await self.limiter.reserve(attempt.action, timedelta(seconds=max(0, budget)))
            if fresh is None or not fresh.reserved:
                break
            slot = fresh
        log.warning(
            "action %s of rate-limited kind %s starts %.3fs after its slot",
            attempt.id,
            attempt.kind,
            time.monotonic() - slot.earliest,
            extra={"event": "rate_slot_missed", "action_id": attempt.id, "kind": attempt.kind},
        )

    async def _execute(self, adapter: ActionAdapter, attempt: ActionAttempt) -> Result:
        if held_connections.get():
            raise TransactionOpenError(
                f"refusing to run the {attempt.kind} adapter while holding a database connection"
            )
        margin = self.settings.write_margin.total_seconds()
        # The adapter runs in this task under a timer, not in a task and a wait of its own (a
        # few futures and callbacks an attempt on the worker's loop). Until the fence passes,
        # the attempt is useful only while the fence could pass; once it passed, the timer runs
        # to just before the lease's end (``LeaseTimer``, ``lease_end_lead``).
        clock = self._lease_clock()
        to_loop = clock.loop.time() - time.monotonic()
        timer = LeaseTimer(
            clock,
            attempt.deadline - margin + to_loop,
            attempt.deadline - lease_end_lead(margin) + to_loop,
            lambda: attempt.fence_passed,
        )
        try:
            with timer:
                result = await adapter.execute(attempt)
        except TimeoutError as error:
            if not timer.expired:  # the adapter's own, not the lease's
                return self._error_result(attempt, error)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            return self._error_result(attempt, error)
        if timer.expired:
            # Also when the adapter swallowed the cancellation and returned: it ran out of time.
            if attempt.fence_passed:
                return self._after_write(attempt, StopReason.LEASE_EXPIRED_DURING_WRITE)
            return Retry(reason="LEASE_RAN_OUT_BEFORE_WRITE")
        if not isinstance(result, RESULT_TYPES):
            return self._error_result(
                attempt, TypeError(f"adapter returned {result!r}, not an outbox result")
            )
        return result

    def _lease_clock(self) -> LeaseClock:
        """The running loop's ticks (an executor may serve one loop, then another)."""
        loop = asyncio.get_running_loop()
        clock = self._clock
        if clock is None or clock.loop is not loop:
            clock = self._clock = LeaseClock(loop)
        return clock

    def _error_result(self, attempt: ActionAttempt, error: Exception) -> Result:
        """An adapter's exception: Retry before its fence; after it, what ``_after_write``
        says."""
        self.observers.adapter_error(attempt, error)
        attempt.error_class = type(error).__qualname__[:200]
        if attempt.fence_passed:
            return self._after_write(attempt, StopReason.ADAPTER_ERROR_AFTER_WRITE)
        return Retry(reason=f"ERROR:{type(error).__name__}")

    def _after_write(self, attempt: ActionAttempt, reason: str) -> Result:
        """An attempt cut short after its fence: the write may exist. A read-back kind retries,
        as it does when a crash lost the lease there (its next attempt sees ``write_started``
        and looks for the write before writing again); an at-most-once kind cannot look, so it
        ends UNCERTAIN and is never attempted again."""
        if attempt.kind in self.read_back_kinds:
            return Retry(reason=reason)
        return Uncertain(reason)

    async def _provider_down(self, action: Action) -> bool:
        """Whether the provider of ``action``'s kind is in an outage, so that its exhausting
        retry gives its attempt back (``outbox.provider_outage``). Unanswered (the database is
        unreachable too), the attempt counts, as it would without an outage."""
        try:
            return await self.store.provider_down(action.kind)
        except OUTAGE:
            return False

    def _claimed_at(self, action: Action) -> datetime | None:
        """When this attempt's claim started its lease (an in-process claim is its own take; a
        worker's take already started the history row, which keeps its own claim time)."""
        return action.lease_until - self.store.lease if action.lease_until else None

    async def _finish(
        self, attempt: ActionAttempt, result: Result, hand_off: timedelta | None
    ) -> Outcome:
        """Writes the result's one finish under the attempt's token (handing the lane on when
        ``hand_off`` says so) and reports it."""
        action = attempt.action
        finish = finish_for(result, action, self.settings)
        if finish is not None and attempt.error_class is not None:
            # An adapter's exception says nothing of its provider: only a Retry the adapter
            # returned counts toward its kind's outage (``outbox.provider_outage``).
            finish = replace(finish, error_class=attempt.error_class, retried=False)
        if (
            finish is not None
            and exhausts_on_retry(finish, action)
            and await self._provider_down(action)
        ):
            finish = ride_out(finish, action, self.settings)
        successor: ClaimedAction | None = None
        finishing_at = time.monotonic()
        fenced = attempt.fence_passed
        if finish is None:
            recorded = False
        elif hand_off is None:
            # The write is spelled out twice: a closure made for every finish would cost every
            # attempt for the sake of an outage (``outbox.outage``).
            try:
                recorded = await self.store.finish(
                    attempt.token, finish, attempt.claimed_at, fenced=fenced
                )
            except OUTAGE as error:
                recorded = await sent_again(
                    lambda: self.store.finish(
                        attempt.token, finish, attempt.claimed_at, fenced=fenced
                    ),
                    error,
                    until=attempt.deadline,
                    what="finish",
                    token=attempt.token,
                )
        else:
            try:
                finished = await self.store.finish_and_hand_off(
                    attempt.token, finish, attempt.claimed_at, fenced=fenced, lease=hand_off
                )
            except OUTAGE as error:
                finished = await sent_again(
                    lambda: self.store.finish_and_hand_off(
                        attempt.token, finish, attempt.claimed_at, fenced=fenced, lease=hand_off
                    ),
                    error,
                    until=attempt.deadline,
                    what="finish",
                    token=attempt.token,
                )
            recorded = finished is not None
            successor = finished.next if finished is not None else None
        outcome = Outcome(
            action.id,
            action.kind,
            action.epoch,
            result,
            recorded,
            finish.state if finish is not None and recorded else None,
            finish.reason if finish is not None else None,
            successor,
            finishing_at,
        )
        self.observers.attempt(outcome)
        if finish is not None and recorded and finish.stop_reason is not None:
            self.observers.ended(action.id, action.kind, finish.state, finish.stop_reason)
        return outcome


def report_housekeeping(
    ended: list[EndedByHousekeeping], observers: Iterable[ExecutorObserver] | None = None
) -> None:
    """Reports housekeeping's ends to ``observers`` (an ``Outbox``'s; by default, metrics and
    logs)."""
    reported = Observers(_default_observers() if observers is None else observers)
    for item in ended:
        reported.ended(item.id, item.kind, item.state, item.reason)


def _default_observers() -> list[ExecutorObserver]:
    # Imported here: the executor itself never imports the metrics (an observer of its own).
    from outbox.outbox import default_observers

    return default_observers()
