"""The shared rate limiter: slots in PostgreSQL, reserved by the worker right before an attempt.

Each limited bucket (a kind, or a kind and a limit key) is one row of ``agent_action_rate``
holding its next free slot. Before running an adapter, the executor reserves the next slot of
every bucket the action draws from in one short statement (``rate_reserve``), sleeps until it by
its own clock, and only then calls the adapter. Slots are ``per / count`` apart, so the calls of
a bucket are spaced evenly and no window of ``per`` ever holds more than ``count`` of them,
whichever worker or process runs them. A slot further away than the executor may wait is not
reserved: the action is deferred until about then (``Defer``, the attempt given back), so a
limited action never spends an attempt and never runs early.

A provider's pause (an adapter's ``Defer``: a 429 with Retry-After) holds every bucket of that
action until then (``rate_hold``), for every worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from outbox._io import Operation, Statement
from outbox.action import Action
from outbox.limits import KindLimits, rate_buckets
from outbox.queries import queries_for
from outbox.store import Store

#: Longest an executor sleeps for a slot; a slot further away defers the action instead (a
#: deferred action frees its worker and its lane's place in the in-flight bound).
MAX_SLOT_WAIT = timedelta(seconds=10)


@dataclass(frozen=True, slots=True)
class Slot:
    """A reservation's answer: ``wait`` seconds from now; ``reserved`` False when it was too far
    to hold (then the action should wait about ``wait`` and try again)."""

    wait: float
    reserved: bool


def _reserve_operation(
    schema: str, buckets: list[tuple[str, timedelta]], max_wait: timedelta
) -> Operation[Slot]:
    q = queries_for(schema)
    params = {
        "buckets": [name for name, _ in buckets],
        "spacings": [spacing for _, spacing in buckets],
        "max_wait": max_wait,
    }
    for _ in range(3):
        (row,) = yield Statement(q["rate_reserve"], params)
        if row["found"] == len(buckets):
            return Slot(max(0.0, float(row["wait"])), bool(row["reserved"]))
        # A bucket row is missing (its first use, or retention pruned it): create, then again.
        yield Statement(q["rate_buckets_ensure"], {"buckets": params["buckets"]})
    raise RuntimeError(f"rate buckets {params['buckets']} vanished three times in a row")


def _hold_operation(schema: str, buckets: list[str], after: timedelta) -> Operation[None]:
    yield Statement(queries_for(schema)["rate_hold"], {"buckets": buckets, "after": after})


class RateLimiter:
    """Reserves slots for the rated kinds of ``kind_limits`` on ``store``'s pool."""

    def __init__(self, store: Store, kind_limits: Mapping[str, KindLimits]) -> None:
        self.store = store
        self.kind_limits = {kind: limits for kind, limits in kind_limits.items() if limits.rated}

    def buckets(self, action: Action) -> list[tuple[str, timedelta]]:
        limits = self.kind_limits.get(action.kind)
        if limits is None:
            return []
        return rate_buckets(action.kind, action.effective_limit_key, limits)

    async def reserve(self, action: Action, max_wait: timedelta) -> Slot | None:
        """The action's slot (None when its kind is not rate-limited)."""
        buckets = self.buckets(action)
        if not buckets:
            return None
        return await self.store.run(_reserve_operation(self.store.schema, buckets, max_wait))

    async def hold(self, action: Action, after: timedelta) -> bool:
        """A provider asked this action to wait ``after``: every bucket it draws from waits as
        long. False when its kind is not rate-limited (the wait is then the action's alone)."""
        buckets = [name for name, _ in self.buckets(action)]
        if not buckets:
            return False
        await self.store.run(_hold_operation(self.store.schema, buckets, after))
        return True
