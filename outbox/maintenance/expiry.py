"""Expiry: a waiting (PROPOSED or ADMITTED) action past its ``expires_at`` ends CANCELLED
``EXPIRED``. An executing one is not touched: its attempt finishes or loses its lease first."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

from outbox._io import Operation, Statement
from outbox.executor import report_housekeeping
from outbox.maintenance.ended import EndedByHousekeeping, ended_from_rows
from outbox.maintenance.service import MaintenanceService
from outbox.queries import queries_for

if TYPE_CHECKING:
    from outbox.observers import ExecutorObserver
    from outbox.store import Store

#: Most actions one turn expires (``SKIP LOCKED``, earliest expiry first); the rest wait a turn.
EXPIRY_LIMIT = 1000


def expire_waiting_operation(
    schema: str, limit: int = EXPIRY_LIMIT
) -> Operation[list[EndedByHousekeeping]]:
    """Ends up to ``limit`` waiting actions past their expiry; returns what it ended."""
    rows = yield Statement(queries_for(schema)["expire_waiting"], {"limit": limit})
    return ended_from_rows(rows)


class Expiry(MaintenanceService):
    name = "expiry"
    failure = "expiring waiting actions failed; trying again at the next housekeeping"

    def __init__(
        self,
        interval: timedelta,
        limit: int = EXPIRY_LIMIT,
        observers: Iterable[ExecutorObserver] | None = None,
    ) -> None:
        super().__init__(interval)
        self.limit = limit
        #: Who hears of the ends (an ``Outbox``'s observers; by default metrics and logs).
        self.observers = observers

    async def run(self, store: Store) -> int:
        ended = await store.run(expire_waiting_operation(store.schema, self.limit))
        report_housekeeping(ended, self.observers)
        return len(ended)
