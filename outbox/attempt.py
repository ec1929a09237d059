"""``ActionAttempt``: what an adapter sees of one claimed attempt, and its fence."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from outbox.action import Action
from outbox.outage import OUTAGE, sent_again

if TYPE_CHECKING:
    from outbox.store import Store


class Fence:
    """Passed right before the provider call; refuses once another claim may own the action."""

    def __init__(self, attempt: ActionAttempt) -> None:
        self._attempt = attempt

    async def begin_write(self, provider_ref: str | None = None) -> bool:
        """Marks the write as started, in its own short transaction.

        Returns False (and the adapter must not call the provider, and returns ``Abandoned()``)
        when the epoch moved, the action was erased, or less than the write margin of the lease
        is left.

        ``provider_ref``: the provider's reference of this write when the adapter knows it
        before the call (an email's Message-ID): the attempt's history keeps it, so an attempt
        that ends UNCERTAIN can still be looked up at the provider. Never an address or a
        payload. ``Done(ref=...)`` later replaces it.
        """
        attempt = self._attempt
        if attempt.fence_passed:
            return True
        store = attempt._store
        try:
            ok = await store.begin_write(
                attempt.token, attempt._margin, provider_ref, attempt.claimed_at
            )
        except OUTAGE as error:
            # Until the write margin is left: the database refuses a fence past it anyway.
            ok = await sent_again(
                lambda: store.begin_write(
                    attempt.token, attempt._margin, provider_ref, attempt.claimed_at
                ),
                error,
                until=attempt.deadline - attempt._margin.total_seconds(),
                what="fence",
                token=attempt.token,
            )
        if ok:
            attempt.fence_passed = True
            if attempt.before_write is not None:
                # A rate-limited attempt: the provider call starts at its slot, not before.
                await attempt.before_write(attempt)
        return ok


class ActionAttempt:
    """One attempt at one action. Read the action's fields; pass the fence before writing."""

    def __init__(
        self,
        action: Action,
        store: Store,
        margin: timedelta,
        deadline: float,
        claimed_at: datetime | None = None,
    ) -> None:
        self.action = action
        #: This claim of the action (made once: the fence and the finish both write under it).
        self.token = action.token
        #: When the claim started (its history row's claimed_at, for an in-process attempt).
        self.claimed_at = claimed_at
        #: The class name of the exception the adapter raised, if any (for the history).
        self.error_class: str | None = None
        self._store = store
        self._margin = margin
        #: time.monotonic() at which this attempt's lease ends (measured conservatively).
        self.deadline = deadline
        self.fence_passed = False
        #: Awaited with the attempt once the fence passed, before it returns: a rate-limited
        #: attempt waits for its slot there (``ActionExecutor``), so the provider call starts
        #: on time.
        self.before_write: Callable[[ActionAttempt], Awaitable[None]] | None = None

    @property
    def id(self) -> int:
        return self.action.id

    @property
    def kind(self) -> str:
        return self.action.kind

    @property
    def epoch(self) -> int:
        return self.action.epoch

    @property
    def attempt(self) -> int:
        """1 on the first attempt."""
        return self.action.attempt

    @property
    def max_attempts(self) -> int:
        return self.action.max_attempts

    @property
    def payload(self) -> Any:
        return self.action.payload

    @property
    def idempotency_key(self) -> str:
        return self.action.idempotency_key

    @property
    def lane_key(self) -> str:
        return self.action.lane_key

    @property
    def workspace_id(self) -> str | None:
        return self.action.workspace_id

    @property
    def subject_account_id(self) -> str | None:
        return self.action.subject_account_id

    @property
    def write_started(self) -> bool:
        """An earlier attempt passed its fence and may have written: read back before writing.

        Also after that attempt's action was retried or deferred: a retry clears the fence, not
        the evidence of the write (``earlier_write_at``)."""
        return self.write_started_at is not None

    @property
    def write_started_at(self) -> datetime | None:
        """When the latest earlier attempt that passed its fence started its write."""
        return self.action.write_started_at or self.action.earlier_write_at

    def time_left(self) -> float:
        """Seconds of lease left, by this process's monotonic clock."""
        return self.deadline - time.monotonic()

    def fence(self) -> Fence:
        # Made at each call, not kept: an attempt that held its fence, which holds the attempt,
        # would be a reference cycle, which only the garbage collector frees (an attempt's
        # objects then outlive it, and a busy process collects every few rounds).
        return Fence(self)
