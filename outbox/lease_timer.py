"""``LeaseTimer``: the one timer that cuts an attempt short when its lease runs out.

Until its fence passes, an attempt is useful only while the fence could still pass, so it is
cut at the lease's end less the write margin; once the fence passed, the margin belongs to the
provider call and it is cut at the lease's end. ``asyncio.timeout_at`` did this with a timer
set on entry and set again when the fence passed (a cancel and a new timer): with thousands of
attempts a second, those timers were a tenth of the executing process's CPU. This timer is set
once, for the earlier moment; when it fires after the fence passed, it sets itself once more,
for the rest. An attempt that ends in time (nearly all) costs one timer and its cancel.

It cancels the task it was entered in, as ``asyncio.Timeout`` does, and turns that cancellation
into ``TimeoutError`` on exit; a cancellation from anyone else (a shutdown) stays one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from types import TracebackType


class LeaseTimer:
    """``with LeaseTimer(cut_at, deadline, fence_passed):`` inside a task: cancels the task at
    ``cut_at`` (loop time), or at ``deadline`` when ``fence_passed()`` says yes by ``cut_at``.
    ``expired`` tells whether it cancelled the task."""

    __slots__ = (
        "_cancelling",
        "_cut_at",
        "_deadline",
        "_fence_passed",
        "_handle",
        "_task",
        "expired",
    )

    def __init__(self, cut_at: float, deadline: float, fence_passed: Callable[[], bool]) -> None:
        self._cut_at = cut_at
        self._deadline = deadline
        self._fence_passed = fence_passed
        self._handle: asyncio.TimerHandle | None = None
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self.expired = False

    def __enter__(self) -> LeaseTimer:
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("LeaseTimer must be used inside a task")
        self._task = task
        self._cancelling = task.cancelling()
        self._handle = task.get_loop().call_at(self._cut_at, self._on_time)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        if self.expired:
            assert self._task is not None
            # Only our own cancellation becomes a TimeoutError: one requested besides it (the
            # task's count of requests stays above what it was on entry) propagates.
            if self._task.uncancel() <= self._cancelling and exc_type is asyncio.CancelledError:
                raise TimeoutError from exc

    def _on_time(self) -> None:
        assert self._task is not None
        if self._fence_passed() and self._cut_at < self._deadline:
            self._cut_at = self._deadline
            self._handle = self._task.get_loop().call_at(self._deadline, self._on_time)
            return
        self._handle = None
        self.expired = True
        self._task.cancel()
