"""The shared rate limiter: slots in PostgreSQL, reserved by the worker right before an attempt.

Each limited bucket (a kind, or a kind and a limit key) is one row of ``agent_action_rate``
holding its next free slot. Before running an adapter, the executor reserves the next slot of
every bucket the action draws from in one short statement (``rate_reserve``), sleeps until just
before it by its own clock, and runs the adapter, whose fence waits out the rest (``SLOT_LEAD``).
Slots are ``per / count`` apart (a little more: ``RATE_GUARD``), so the calls of a bucket are
spaced evenly and no window of ``per`` holds more than ``count`` of them, whichever worker or
process runs them. A slot further away than the executor may wait is not reserved: the action
is deferred until about then (``Defer``, the attempt given back), so a limited action never
spends an attempt and never runs early.

A provider's pause (an adapter's ``Defer``: a 429 with Retry-After) holds every bucket of that
action until then (``rate_hold``), for every worker.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from outbox._io import Operation, Statement
from outbox.action import Action
from outbox.limits import RATE_GUARD, KindLimits, rate_buckets
from outbox.queries import queries_for
from outbox.store import Store

#: The executor passes the fence this many seconds before its slot, and the fence then waits
#: out the rest: the provider call starts at its slot, not a fence statement's latency after
#: it (which varies with load, and would bunch calls). A crash inside this short wait, after
#: the fence, counts as one after the write started (an at-most-once action ends UNCERTAIN).
SLOT_LEAD = 0.25
#: Longest an executor sleeps for a slot; a slot further away defers the action instead (a
#: deferred action frees its worker and its lane's place in the in-flight bound).
MAX_SLOT_WAIT = timedelta(seconds=10)


#: Clock bounds are gathered afresh this often (seconds), so that the two clocks' drift never
#: accumulates into them.
CLOCK_WINDOW = 60.0


class DbClock:
    """Where the database's clock stands against this process's ``time.monotonic()``.

    Every reservation reads the database clock at some instant between sending its statement
    and receiving the answer, so ``db - local`` lies between ``db_now - received`` and
    ``db_now - sent``; the tightest bounds over recent reservations (the fastest round trip)
    place a database time on the local clock to within a fraction of a millisecond, however
    slow a given round trip was (an NTP-style estimate, with bounds instead of a midpoint).
    """

    def __init__(self) -> None:
        self.lo = -math.inf
        self.hi = math.inf
        self._since = -math.inf

    def sample(self, sent: float, received: float, db_now: float) -> None:
        lo, hi = db_now - received, db_now - sent
        if received - self._since > CLOCK_WINDOW or max(self.lo, lo) > min(self.hi, hi):
            # A new window, or the clocks stepped against each other: start from this one.
            self.lo, self.hi, self._since = lo, hi, received
            return
        self.lo, self.hi = max(self.lo, lo), min(self.hi, hi)

    def local(self, db_time: float) -> tuple[float, float]:
        """The earliest and the latest local time ``db_time`` can be."""
        return db_time - self.hi, db_time - self.lo


@dataclass(frozen=True, slots=True)
class Slot:
    """A reservation's answer: ``wait`` seconds from now; ``reserved`` False when it was too far
    to hold (then the action should wait about ``wait`` and try again).

    ``earliest`` and ``at`` bound the slot on this process's ``time.monotonic()`` (``DbClock``):
    it is no later than ``at`` (wait until then: never early) and no earlier than
    ``earliest``, so a call made at ``t`` is at most ``t - earliest`` late."""

    wait: float
    reserved: bool
    earliest: float = 0.0
    at: float = 0.0


def _reserve_operation(
    schema: str, buckets: list[tuple[str, timedelta]], max_wait: timedelta, clock: DbClock
) -> Operation[Slot]:
    q = queries_for(schema)
    params = {
        "buckets": [name for name, _ in buckets],
        "spacings": [spacing for _, spacing in buckets],
        "max_wait": max_wait,
    }
    for _ in range(3):
        sent = time.monotonic()
        (row,) = yield Statement(q["rate_reserve"], params)
        received = time.monotonic()
        if row["found"] == len(buckets):
            clock.sample(sent, received, float(row["db_now"]))
            earliest, at = clock.local(float(row["at_epoch"]))
            return Slot(max(0.0, float(row["wait"])), bool(row["reserved"]), earliest, at)
        # A bucket row is missing (its first use, or retention pruned it): create, then again.
        yield Statement(q["rate_buckets_ensure"], {"buckets": params["buckets"]})
    raise RuntimeError(f"rate buckets {params['buckets']} vanished three times in a row")


#: A bucket no reservation used for this long is deleted by the retention (a key's bucket: keys
#: come and go); its next use creates it afresh.
IDLE_BUCKET = timedelta(days=1)


def prune_buckets_operation(schema: str, idle: timedelta = IDLE_BUCKET) -> Operation[int]:
    """Deletes the rate buckets unused for ``idle`` (and not held by a provider's pause)."""
    yield Statement(queries_for(schema)["rate_prune"], {"idle": idle})
    return 0


def _hold_operation(schema: str, buckets: list[str], after: timedelta) -> Operation[None]:
    yield Statement(queries_for(schema)["rate_hold"], {"buckets": buckets, "after": after})


class RateLimiter:
    """Reserves slots for the rated kinds of ``kind_limits`` on ``store``'s pool."""

    def __init__(self, store: Store, kind_limits: Mapping[str, KindLimits]) -> None:
        self.store = store
        self.kind_limits = {kind: limits for kind, limits in kind_limits.items() if limits.rated}
        self.clock = DbClock()

    def rated(self, kind: str) -> bool:
        """Whether ``kind`` has a rate limit (an attempt of any other waits for no slot)."""
        return kind in self.kind_limits

    def buckets(self, action: Action) -> list[tuple[str, timedelta]]:
        limits = self.kind_limits.get(action.kind)
        if limits is None:
            return []
        return rate_buckets(action.kind, action.effective_limit_key, limits)

    def tolerance(self, action: Action) -> float:
        """Seconds a call may start after its slot: three quarters of what the guard leaves
        (``RATE_GUARD``), the rest a margin for what happens between the executor's last look
        at the clock and the adapter's call (synchronous code, but another thread may hold the
        GIL for its switch interval, 5 ms)."""
        limits = self.kind_limits.get(action.kind)
        pers = [r.per for r in (limits.rate, limits.key_rate) if r] if limits else []
        return min(pers).total_seconds() * RATE_GUARD * 3 / 4 if pers else 0.0

    async def reserve(self, action: Action, max_wait: timedelta) -> Slot | None:
        """The action's slot (None when its kind is not rate-limited)."""
        buckets = self.buckets(action)
        if not buckets:
            return None
        op = _reserve_operation(self.store.schema, buckets, max_wait, self.clock)
        return await self.store.run(op)

    async def hold(self, action: Action, after: timedelta) -> bool:
        """A provider asked this action to wait ``after``: every bucket it draws from waits as
        long. False when its kind is not rate-limited (the wait is then the action's alone)."""
        buckets = [name for name, _ in self.buckets(action)]
        if not buckets:
            return False
        await self.store.run(_hold_operation(self.store.schema, buckets, after))
        return True
