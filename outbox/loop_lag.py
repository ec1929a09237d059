"""How late a process's event loop runs its timers: ``outbox_event_loop_lag_seconds``, and a
warning in the log when it stalls.

Everything the outbox does on time is a timer on its loop: the cut of an attempt at its lease's
end (``outbox.lease_timer``), the heartbeat, the claimer's poll. A loop that runs late (a
process starved of CPU, a host that overcommits its cores, an adapter that blocks the loop with
a synchronous call) cuts its attempts late, after their lease ran out and another worker may
have taken the action again: the fences keep every write exact, but an attempt cut late may
still be waiting on its provider beside its successor. Its timers are late by as much as this
measures.

One sampler task a loop: it sleeps ``SAMPLE`` seconds and measures how much later than asked it
woke. The gauge holds the largest lateness of the last ``WINDOW`` seconds (a scrape sees a stall
between two scrapes); a lateness over ``STALL`` is logged, at most once a ``WINDOW``, with how
many stalls there were since the last line.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque

from outbox import metrics

log = logging.getLogger("outbox.loop")

#: Seconds between two samples: a sampler costs a loop timer this often (at four a second, an
#: idle worker process spent 0.12% of a core on it). A stall shorter than this may fall between
#: two samples; a loop that stays starved does not.
SAMPLE = 1.0
#: Seconds the gauge remembers a lateness for (a scrape interval, say).
WINDOW = 15.0
#: A lateness above this many seconds is logged.
STALL = 1.0


class LoopLag:
    """``await LoopLag(role).watch()`` on a loop samples it until cancelled."""

    def __init__(
        self, role: str, *, sample: float = SAMPLE, window: float = WINDOW, stall: float = STALL
    ) -> None:
        self.role = role
        self.sample = sample
        self.window = window
        self.stall = stall
        #: (monotonic time, lateness) of the samples within the window, oldest first.
        self._recent: deque[tuple[float, float]] = deque()
        self._stalls = 0
        self._worst = 0.0
        self._logged_at = float("-inf")

    @property
    def lag(self) -> float:
        """The largest lateness of the window (0.0 before any sample)."""
        return max((late for _, late in self._recent), default=0.0)

    async def watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.sample
            await asyncio.sleep(self.sample)
            self.record(max(0.0, loop.time() - due), time.monotonic())

    def record(self, late: float, now: float) -> None:
        """One sample, ``late`` seconds late, taken at ``now`` (monotonic)."""
        self._recent.append((now, late))
        while self._recent and self._recent[0][0] < now - self.window:
            self._recent.popleft()
        metrics.EVENT_LOOP_LAG.labels(self.role).set(self.lag)
        if late > self.stall:
            self._stalls += 1
            self._worst = max(self._worst, late)
        if self._stalls and now - self._logged_at >= self.window:
            log.warning(
                "the %s's event loop ran %s timer(s) over %.1f s late (the worst %.2f s late): "
                "this process gets too little CPU, or something blocks its loop; attempts are "
                "cut that much past their lease",
                self.role,
                self._stalls,
                self.stall,
                self._worst,
                extra={"event": "loop_stalled", "role": self.role, "lag_s": round(self._worst, 3)},
            )
            self._stalls, self._worst, self._logged_at = 0, 0.0, now


def start_watching(role: str) -> asyncio.Task[None]:
    """Starts a ``LoopLag`` sampler on the running loop; cancel the task to stop it."""
    return asyncio.get_running_loop().create_task(LoopLag(role).watch(), name=f"loop-lag-{role}")
