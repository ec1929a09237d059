"""Expiry: a waiting (PROPOSED or ADMITTED) action past its ``expires_at`` ends CANCELLED
``EXPIRED``. An executing one is not touched: its attempt finishes or loses its lease first."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING

from outbox._io import Operation
from outbox.maintenance.ended import EndedByHousekeeping, EndingService, ending_operation

if TYPE_CHECKING:
    from outbox.observers import ExecutorObserver

#: Most actions one turn expires (``SKIP LOCKED``, earliest expiry first); the rest wait a turn.
EXPIRY_LIMIT = 1000


def expire_waiting_operation(
    schema: str, limit: int = EXPIRY_LIMIT
) -> Operation[list[EndedByHousekeeping]]:
    """Ends up to ``limit`` waiting actions past their expiry; returns what it ended."""
    return (yield from ending_operation(schema, "expire_waiting", limit))


class Expiry(EndingService):
    name = "expiry"
    failure = "expiring waiting actions failed; trying again at the next housekeeping"

    def __init__(
        self,
        interval: timedelta,
        limit: int = EXPIRY_LIMIT,
        observers: Iterable[ExecutorObserver] | None = None,
    ) -> None:
        super().__init__(interval, limit, observers)

    def operation(self, schema: str) -> Operation[list[EndedByHousekeeping]]:
        return expire_waiting_operation(schema, self.limit)
