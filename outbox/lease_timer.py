"""``LeaseTimer``: what cuts an attempt short when its lease runs out; ``LeaseClock``: the few
loop timers all of a process's attempts share.

Until its fence passes, an attempt is useful only while the fence could still pass, so it is
cut at the lease's end less the write margin; once the fence passed, the margin belongs to the
provider call and it is cut at the lease's end, less a lead (``lease_end_lead``): a process whose
loop runs its timers late by less than the lead still cuts the attempt before another claimer
may take its action again, so the next action of its lane never starts beside it.

``asyncio.timeout_at`` did this with a loop timer set on entry and set again when the fence
passed: with thousands of attempts a second, making and cancelling those timers was a tenth of
the executing process's CPU. Here an attempt joins the tick of its cut instead: the ticks are
``TICK`` apart, and each has one loop timer, however many attempts it cuts (a claim round's
attempts all share one). An attempt that ends in time (nearly all) leaves its tick's set and
costs no timer of its own; the last to leave a tick cancels the tick's loop timer. An attempt
is cut up to a tick early, never late. When its tick comes after its fence passed, it joins
the tick of its deadline (the lease's end less the lead).

A cut cancels the task the timer was entered in, as ``asyncio.Timeout`` does, and that
cancellation becomes ``TimeoutError`` on exit; a cancellation from anyone else (a shutdown)
stays one.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable
from types import TracebackType

#: Seconds between ticks: how early an attempt may be cut. Small beside a write margin (a
#: minute by default).
TICK = 0.05
#: Seconds before the lease's end that an attempt past its fence is cut: how late a busy loop
#: may run the cut's timer before a reclaim could start beside the attempt. At most half the
#: write margin, which is the provider call's time.
LEASE_END_LEAD = 0.25


def lease_end_lead(write_margin: float) -> float:
    """How long before the lease's end an attempt past its fence is cut, for a write margin of
    ``write_margin`` seconds."""
    return min(LEASE_END_LEAD, write_margin / 2)


class LeaseClock:
    """The ticks of one event loop: ``{tick: (the timers it cuts, its loop timer)}``."""

    __slots__ = ("_loop", "_ticks")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._ticks: dict[int, tuple[set[LeaseTimer], asyncio.TimerHandle]] = {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    @property
    def ticks(self) -> int:
        """Ticks with a timer to cut (each holds one loop timer)."""
        return len(self._ticks)

    def join(self, timer: LeaseTimer, at: float) -> int:
        """Cuts ``timer`` at its tick at or before ``at`` (loop time); returns the tick."""
        tick = math.floor(at / TICK)
        entry = self._ticks.get(tick)
        if entry is None:
            entry = self._ticks[tick] = (
                set(),
                self._loop.call_at(tick * TICK, self._on_tick, tick),
            )
        entry[0].add(timer)
        return tick

    def leave(self, timer: LeaseTimer, tick: int) -> None:
        entry = self._ticks.get(tick)
        if entry is None:
            return
        timers, handle = entry
        timers.discard(timer)
        if not timers:
            # The last of its timers left in time: the tick goes, and its loop timer (a lease is
            # minutes long, and a busy process would keep one a tick until then).
            handle.cancel()
            del self._ticks[tick]

    def _on_tick(self, tick: int) -> None:
        entry = self._ticks.pop(tick, None)
        if entry is not None:
            for timer in entry[0]:
                timer._on_time()


class LeaseTimer:
    """``with LeaseTimer(clock, cut_at, deadline, fence_passed):`` inside a task: cancels the
    task at ``cut_at`` (loop time), or at ``deadline`` when ``fence_passed()`` says yes by
    then; each up to a ``TICK`` early. ``expired`` tells whether it cancelled the task."""

    __slots__ = (
        "_cancelling",
        "_clock",
        "_cut_at",
        "_deadline",
        "_fence_passed",
        "_task",
        "_tick",
        "expired",
    )

    def __init__(
        self, clock: LeaseClock, cut_at: float, deadline: float, fence_passed: Callable[[], bool]
    ) -> None:
        self._clock = clock
        self._cut_at = cut_at
        self._deadline = deadline
        self._fence_passed = fence_passed
        self._task: asyncio.Task[object] | None = None
        self._tick: int | None = None
        self._cancelling = 0
        self.expired = False

    def __enter__(self) -> LeaseTimer:
        task = asyncio.current_task(self._clock.loop)
        if task is None:
            raise RuntimeError("LeaseTimer must be used inside a task of its clock's loop")
        self._task = task
        self._cancelling = task.cancelling()
        self._tick = self._clock.join(self, self._cut_at)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._tick is not None:
            self._clock.leave(self, self._tick)
            self._tick = None
        if self.expired:
            assert self._task is not None
            # Only our own cancellation becomes a TimeoutError: one requested besides it (the
            # task's count of requests stays above what it was on entry) propagates.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def _on_time(self) -> None:
        """Its tick came (it is no longer in the tick's set)."""
        assert self._task is not None
        if self._fence_passed() and self._cut_at < self._deadline:
            self._cut_at = self._deadline
            self._tick = self._clock.join(self, self._deadline)
            return
        self._tick = None
        self.expired = True
        self._task.cancel()
