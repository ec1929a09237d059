"""The services that end actions (lost leases, expiry): one bounded statement a turn, whose
ends are reported to the outbox's observers, one record an ended action."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from outbox._io import Operation, Statement
from outbox.executor import report_housekeeping
from outbox.maintenance.service import MaintenanceService
from outbox.queries import queries_for
from outbox.state import ActionState

if TYPE_CHECKING:
    from outbox.observers import ExecutorObserver
    from outbox.store import Store


@dataclass(frozen=True, slots=True)
class EndedByHousekeeping:
    """An action a maintenance service ended, with the state and stop reason it wrote."""

    id: int
    kind: str
    state: ActionState
    reason: str


def ended_from_rows(rows: list[dict[str, Any]]) -> list[EndedByHousekeeping]:
    """``RETURNING id, kind, state, stop_reason`` rows as records."""
    return [
        EndedByHousekeeping(r["id"], r["kind"], ActionState(r["state"]), r["stop_reason"])
        for r in rows
    ]


def ending_operation(schema: str, query: str, limit: int) -> Operation[list[EndedByHousekeeping]]:
    """Runs the named ending statement for up to ``limit`` actions; returns what it ended."""
    rows = yield Statement(queries_for(schema)[query], {"limit": limit})
    return ended_from_rows(rows)


class EndingService(MaintenanceService):
    """Ends up to ``limit`` actions a turn with its ``operation`` and reports each end to
    ``observers`` (an ``Outbox``'s; by default metrics and logs)."""

    def __init__(
        self,
        interval: timedelta,
        limit: int,
        observers: Iterable[ExecutorObserver] | None = None,
    ) -> None:
        super().__init__(interval)
        self.limit = limit
        self.observers = observers

    @abstractmethod
    def operation(self, schema: str) -> Operation[list[EndedByHousekeeping]]:
        """The turn's statement (a module-level function, so tests can run it alone)."""

    async def run(self, store: Store) -> int:
        ended = await store.run(self.operation(store.schema))
        report_housekeeping(ended, self.observers)
        return len(ended)

    def behind(self, handled: int) -> bool:
        return handled >= self.limit
