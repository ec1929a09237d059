"""``outbox_event_loop_lag_seconds``: a loop that runs its timers late (a process starved of CPU,
a blocking call on the loop) shows in the gauge and in one warning a window, and a worker
process's loop and a claimer's are watched."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from outbox import metrics
from outbox.loop_lag import LoopLag


def gauge(role: str) -> float:
    return metrics.EVENT_LOOP_LAG.labels(role)._value.get()


def test_a_loop_blocked_for_half_a_second_shows_in_the_gauge_and_the_log(caplog) -> None:
    watcher = LoopLag("blocked-test", sample=0.05, window=0.2, stall=0.3)
    seen: list[tuple[float, float]] = []

    async def main() -> None:
        task = asyncio.get_running_loop().create_task(watcher.watch())
        await asyncio.sleep(0.2)
        time.sleep(0.5)  # the loop runs nothing meanwhile, its timers included
        await asyncio.sleep(0.01)  # the sampler's overdue wake-up ran first
        seen.append((watcher.lag, gauge("blocked-test")))
        await asyncio.sleep(0.3)  # a window later: a stall counted meanwhile is logged
        task.cancel()

    with caplog.at_level(logging.WARNING, logger="outbox.loop"):
        asyncio.run(main())
    ((lag, gauged),) = seen
    assert 0.4 <= lag < 1.5 and gauged == lag, seen
    stalled = [r for r in caplog.records if getattr(r, "event", None) == "loop_stalled"]
    assert any(r.role == "blocked-test" and r.lag_s >= 0.4 for r in stalled), stalled
    assert all("the blocked-test's event loop ran" in r.getMessage() for r in stalled)
    assert all("over 0.3 s late" in r.getMessage() for r in stalled)


@given(
    st.lists(
        st.tuples(st.floats(0.0, 3.0), st.floats(0.0, 2.0)),  # (seconds since the last, lateness)
        min_size=1,
        max_size=40,
    )
)
def test_the_gauge_is_the_largest_lateness_of_the_window(samples: list[Any]) -> None:
    watcher = LoopLag("window-test", window=5.0, stall=10.0)
    now, seen = 0.0, []
    for gap, late in samples:
        now += gap
        seen.append((now, late))
        watcher.record(late, now)
    expected = max(late for at, late in seen if at >= now - 5.0)
    assert watcher.lag == expected
    assert gauge("window-test") == expected


def test_stalls_are_logged_at_most_once_a_window_with_their_count(caplog) -> None:
    watcher = LoopLag("count-test", window=10.0, stall=1.0)
    with caplog.at_level(logging.WARNING, logger="outbox.loop"):
        watcher.record(2.0, 100.0)  # logged at once
        watcher.record(1.5, 101.0)  # within the window: counted
        watcher.record(3.0, 105.0)
        watcher.record(0.0, 109.0)
        watcher.record(0.0, 110.5)  # the window passed: the two since, the worst 3.0 s
        watcher.record(0.0, 125.0)  # nothing since: nothing logged
    lines = [r.getMessage() for r in caplog.records if getattr(r, "event", None) == "loop_stalled"]
    assert len(lines) == 2, lines
    assert "ran 1 timer(s)" in lines[0] and "(the worst 2.00 s late)" in lines[0]
    assert "ran 2 timer(s)" in lines[1] and "(the worst 3.00 s late)" in lines[1]


def test_a_worker_process_watches_its_loop_while_its_runtime_runs(make_outbox: Any) -> None:
    from outbox.dispatch.runtime import WorkerRuntime

    runtime = WorkerRuntime(make_outbox())
    try:
        runtime.wait_ready(timeout=30)
        loop = runtime._thread.loop  # type: ignore[union-attr]

        async def names() -> set[str]:
            return {task.get_name() for task in asyncio.all_tasks()}

        watching = asyncio.run_coroutine_threadsafe(names(), loop).result(timeout=5)
        assert "loop-lag-worker" in watching
    finally:
        runtime.stop()


def test_a_claimer_watches_its_loop_until_it_stops(make_outbox: Any, redis_url: str) -> None:
    from outbox.dispatch import broker_from_url, install
    from outbox.dispatch.claimer import run_claimer_async

    ob = make_outbox()
    ob.migrate()
    dispatch = install(ob, broker_from_url(redis_url))

    def watching() -> bool:
        return any(t.get_name() == "loop-lag-claimer" and not t.done() for t in asyncio.all_tasks())

    async def main() -> tuple[bool, bool]:
        stop = asyncio.Event()
        claiming = asyncio.get_running_loop().create_task(run_claimer_async(dispatch, stop=stop))
        await asyncio.sleep(1.0)
        running = watching()
        stop.set()
        await asyncio.wait_for(claiming, 10)
        await asyncio.sleep(0.05)  # the cancelled sampler ends
        return running, watching()

    running, left = asyncio.run(main())
    assert running and not left
