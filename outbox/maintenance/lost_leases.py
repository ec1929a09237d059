"""Lost leases: an executing action whose lease ran out and that may not run again ends.

That is an at-most-once action whose write started (UNCERTAIN ``LEASE_LOST_AFTER_WRITE``: the
effect may exist) and any action whose last attempt a worker took (FAILED
``ATTEMPTS_EXHAUSTED``). Any other expired lease is left to the next claim, which reclaims it.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

from outbox._io import Operation
from outbox.maintenance.ended import EndedByHousekeeping, EndingService, ending_operation

if TYPE_CHECKING:
    from outbox.observers import ExecutorObserver

#: Most actions one turn ends (``SKIP LOCKED``, oldest lease first); the rest wait a turn.
LOST_LEASES_LIMIT = 1000


def end_lost_leases_operation(
    schema: str, limit: int = LOST_LEASES_LIMIT
) -> Operation[list[EndedByHousekeeping]]:
    """Ends up to ``limit`` lost leases that may not run again; returns what it ended."""
    return (yield from ending_operation(schema, "end_lost_leases", limit))


class LostLeases(EndingService):
    name = "lost_leases"
    failure = "ending lost leases failed; trying again at the next housekeeping"

    def __init__(
        self,
        interval: timedelta,
        limit: int = LOST_LEASES_LIMIT,
        observers: Iterable[ExecutorObserver] | None = None,
    ) -> None:
        super().__init__(interval, limit, observers)

    def operation(self, schema: str) -> Operation[list[EndedByHousekeeping]]:
        return end_lost_leases_operation(schema, self.limit)
