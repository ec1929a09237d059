"""The lease timer: cut at the margin before the fence, at the lease's end after it, and only
its own cancellation turned into TimeoutError."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from outbox.lease_timer import LeaseTimer


def timer(cut_in: float, deadline_in: float, passed: list[bool]) -> LeaseTimer:
    now = asyncio.get_running_loop().time()
    return LeaseTimer(now + cut_in, now + deadline_in, lambda: passed[0])


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
    cut = timer(0.05, 0.3, passed)
    started = asyncio.get_running_loop().time()
    with pytest.raises(TimeoutError), cut:
        await asyncio.sleep(5)
    took = asyncio.get_running_loop().time() - started
    assert cut.expired
    assert 0.25 < took < 1


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


async def test_a_cancellation_from_outside_stays_a_cancellation():
    async def attempt(cut: LeaseTimer) -> None:
        with cut:
            await asyncio.sleep(5)

    cut = timer(5.0, 10.0, [False])
    task = asyncio.create_task(attempt(cut))
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert not cut.expired


async def test_a_cancellation_from_outside_beside_the_cut_stays_a_cancellation():
    async def attempt(cut: LeaseTimer) -> None:
        with cut:
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                # Both the cut and a shutdown ask before the task runs again.
                await asyncio.sleep(0.1)
                raise

    cut = timer(0.02, 10.0, [False])
    task = asyncio.create_task(attempt(cut))
    await asyncio.sleep(0.05)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
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
