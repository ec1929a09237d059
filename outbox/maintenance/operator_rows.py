"""Maintenance of the operator's rows: payloads parked for a resend or retry are dropped after
their retention, and the heartbeat rows of processes long silent (a SIGKILLed process leaves its
row behind) are deleted."""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING

from outbox._io import Operation, Statement
from outbox.maintenance.service import MaintenanceService
from outbox.queries import queries_for

if TYPE_CHECKING:
    from outbox.store import Store

log = logging.getLogger("outbox.housekeeping")

#: Most parked payloads one turn drops.
PARKED_BATCH = 1000


def _count(schema: str, name: str, params: dict[str, object]) -> Operation[int]:
    rows = yield Statement(queries_for(schema)[name], params)
    return len(rows)


class ParkedPayloads(MaintenanceService):
    """Drops parked payloads older than ``retention``, a bounded batch a turn."""

    name = "parked_payloads"
    failure = "dropping old parked payloads failed; trying again at the next housekeeping"

    def __init__(self, interval: timedelta, retention: timedelta) -> None:
        super().__init__(interval)
        self.retention = retention

    async def run(self, store: Store) -> int:
        params = {"retention": self.retention, "limit": PARKED_BATCH}
        dropped = await store.run(_count(store.schema, "prune_parked_payloads", params))
        if dropped:
            log.info("dropped %s parked payloads older than %s", dropped, self.retention)
        return dropped

    def behind(self, handled: int) -> bool:
        return handled >= PARKED_BATCH


class StaleProcesses(MaintenanceService):
    """Deletes the heartbeat rows of processes silent for longer than ``stale_after``."""

    name = "stale_processes"
    failure = "deleting stale process rows failed; trying again at the next housekeeping"

    def __init__(self, interval: timedelta, stale_after: timedelta) -> None:
        super().__init__(interval)
        self.stale_after = stale_after

    async def run(self, store: Store) -> int:
        gone = await store.run(
            _count(store.schema, "prune_stale_processes", {"stale": self.stale_after})
        )
        if gone:
            log.info("deleted %s process rows silent for over %s", gone, self.stale_after)
        return gone
