"""The lease timer: cut at the margin before the fence, at the lease's end after it, and only
its own cancellation turned into TimeoutError."""

from __future__ import annotations

import asyncio
import contextlib
import math

import pytest

from outbox.lease_timer import TICK, LeaseClock, LeaseTimer


def timer(
    cut_in: float, deadline_in: float, passed: list[bool], clock: LeaseClock | None = None
) -> LeaseTimer:
    loop = asyncio.get_running_loop()
    now = loop.time()
    return LeaseTimer(clock or LeaseClock(loop), now + cut_in, now + deadline_in, lambda: passed[0])


async def test_an_attempt_short_of_its_fence_is_cut_at_the_margin():
    cut = timer(0.05, 5.0, [False])
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError), cut:
        await asyncio.sleep(5)
    assert cut.expired
    assert asyncio.get_running_loop().time() - started < 1
    assert asyncio.current_task().cancelling() == 0


async def test_an_attempt_past_its_fence_runs_into_the_margin_and_ends_in_time():
    passed = [False]
    cut = timer(0.05, 0.5, passed)
    with cut:
        passed[0] = True
        await asyncio.sleep(0.2)
    assert not cut.expired


async def test_an_attempt_past_its_fence_is_cut_at_the_lease_end():
    passed = [True]
    cut = timer(0.05, 0.4, passed)
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError), cut:
        await asyncio.sleep(5)
    took = asyncio.get_running_loop().time() - started
    assert cut.expired
    assert 0.4 - TICK <= took < 1


async def test_the_fence_passing_after_the_cut_does_not_save_the_attempt():
    passed = [False]
    cut = timer(0.05, 5.0, passed)
    with pytest.raises(TimeoutError), cut:
        try:
            await asyncio.sleep(5)
        finally:
            passed[0] = True
    assert cut.expired


async def test_the_bodys_own_timeout_is_not_the_leases():
    cut = timer(5.0, 10.0, [False])
    with pytest.raises(TimeoutError), cut:
        async with asyncio.timeout(0.01):
            await asyncio.sleep(1)
    assert not cut.expired


async def run_and_cancel(cut: LeaseTimer, after: float, linger: float = 0.0) -> None:
    """An attempt under ``cut``, cancelled from outside ``after`` seconds in; told to stop, it
    takes ``linger`` seconds to give up. The cancellation must reach the caller."""

    async def attempt() -> None:
        with cut:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                await asyncio.sleep(linger)
                raise

    task = asyncio.create_task(attempt())
    await asyncio.sleep(after)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_cancellation_from_outside_stays_a_cancellation():
    cut = timer(5.0, 10.0, [False])
    await run_and_cancel(cut, after=0.01)
    assert not cut.expired


async def test_a_cancellation_from_outside_beside_the_cut_stays_a_cancellation():
    # The cut comes first; the shutdown's cancel arrives while the attempt is giving up.
    cut = timer(0.02, 10.0, [False])
    await run_and_cancel(cut, after=0.05, linger=0.1)
    assert cut.expired


async def test_a_body_that_swallows_the_cut_returns_and_the_task_is_not_left_cancelling():
    cut = timer(0.02, 10.0, [False])
    with cut, contextlib.suppress(asyncio.CancelledError):
        await asyncio.sleep(5)
    assert cut.expired
    assert asyncio.current_task().cancelling() == 0
    await asyncio.sleep(0)  # the task is not cancelled again


async def test_an_attempt_that_ends_in_time_leaves_no_timer_behind():
    cut = timer(0.02, 0.05, [True])
    with cut:
        await asyncio.sleep(0)
    await asyncio.sleep(0.1)  # past both moments: nothing cancels this task
    assert not cut.expired


async def test_a_cut_comes_at_most_a_tick_early_and_never_late():
    loop = asyncio.get_running_loop()
    clock = LeaseClock(loop)
    for offset in (0.0, 0.013, 0.029, 0.047):
        cut_at = loop.time() + 0.2 + offset
        cut = LeaseTimer(clock, cut_at, cut_at + 10, lambda: False)
        with pytest.raises(TimeoutError), cut:
            await asyncio.sleep(5)
        cut_came = loop.time()
        assert cut_at - TICK <= cut_came < cut_at + 0.1  # the loop's own lateness at most


async def test_attempts_cut_in_the_same_tick_share_one_loop_timer():
    loop = asyncio.get_running_loop()
    clock = LeaseClock(loop)
    scheduled = len(loop._scheduled)  # asyncio's own loop: its pending timers
    cut_at = (int(loop.time() / TICK) + 20) * TICK + TICK / 2
    cuts = [LeaseTimer(clock, cut_at, cut_at + 10, lambda: False) for _ in range(100)]

    async def attempt(cut: LeaseTimer) -> None:
        with cut:
            await asyncio.sleep(5)

    tasks = [asyncio.create_task(attempt(cut)) for cut in cuts]
    await asyncio.sleep(0)
    assert len(loop._scheduled) - scheduled <= 1 + len(tasks)  # the tick, and each sleep's
    results = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(result, TimeoutError) for result in results)
    assert all(cut.expired for cut in cuts)


async def test_ticks_whose_attempts_all_ended_in_time_keep_no_loop_timer():
    loop = asyncio.get_running_loop()
    clock = LeaseClock(loop)

    def live_loop_timers() -> int:  # asyncio's own loop: its pending, uncancelled timers
        return sum(1 for handle in loop._scheduled if not handle.cancelled())

    before = live_loop_timers()
    now = loop.time()
    # Rounds claimed over a second, each cut minutes later, as a lease's are.
    cut_ats = [now + 240 + i * 0.01 for i in range(100)]
    ticks = len({math.floor(at / TICK) for at in cut_ats})
    assert ticks >= 20
    cuts = [LeaseTimer(clock, at, now + 300, lambda: False) for at in cut_ats]
    for cut in cuts:
        cut.__enter__()
    assert clock.ticks == ticks
    assert live_loop_timers() == before + ticks
    for cut in cuts:
        cut.__exit__(None, None, None)
    assert clock.ticks == 0
    assert live_loop_timers() == before
