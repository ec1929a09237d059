"""``MaintenanceService``: one bounded, periodic piece of maintenance."""

from __future__ import annotations

from abc import ABC, abstractmethod
from datetime import timedelta
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from outbox.store import Store


class MaintenanceService(ABC):
    """Runs one turn at most every ``interval``; a turn does a bounded amount of work.

    ``failure`` is the line ``Maintenance`` logs when a turn raises; the service then waits for
    its next turn.
    """

    #: Short name, for logs and tests.
    name: ClassVar[str]
    #: Logged (with the exception) when a turn fails.
    failure: ClassVar[str]

    def __init__(self, interval: timedelta) -> None:
        if interval < timedelta(0):
            raise ValueError(f"{type(self).__name__} interval must not be negative: {interval}")
        self.interval = interval

    @abstractmethod
    async def run(self, store: Store) -> int:
        """One turn; returns how many actions (or rows) it handled."""

    def behind(self, handled: int) -> bool:
        """Whether a turn that handled ``handled`` stopped at its bound with work left over: the
        runner then gives it its next turn early (``Maintenance.run_due``). Unbounded services
        are never behind."""
        return False
