"""Backlog gauges: read from the database (four short statements) and set, so every process
that serves metrics shows the numbers the database holds, however many claimers run."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from outbox._io import Operation
from outbox.backlog import Backlog, backlog_operation
from outbox.limits_view import LimitsView, limits_view_operation
from outbox.maintenance.service import MaintenanceService
from outbox.metrics import set_backlog_gauges, set_limit_gauges, set_vacuum_horizon_gauges
from outbox.vacuum_horizon import horizon_holders_operation

if TYPE_CHECKING:
    from outbox.store import Store


def gauge_reads_operation(
    schema: str,
) -> Operation[tuple[Backlog, LimitsView, list[dict[str, Any]]]]:
    """The backlog, the waits the limits cause and every hold on the vacuum horizon (a row for
    each session with an open snapshot, each slot and each replica holding it): one pooled
    connection for the three reads (each its own statement, autocommit)."""
    backlog = yield from backlog_operation(schema)
    waits = yield from limits_view_operation(schema, {})
    holders = yield from horizon_holders_operation(
        schema, older_than=timedelta(0), limit=None, older_than_xids=0
    )
    return backlog, waits, holders


async def refresh_backlog_gauges(store: Store) -> Backlog:
    """Reads the backlog, the waits the limits cause and the holds on the vacuum horizon, and
    sets the gauges; returns the backlog."""
    backlog, waits, holders = await store.run(gauge_reads_operation(store.schema))
    set_backlog_gauges(backlog)
    set_limit_gauges(waits)
    set_vacuum_horizon_gauges(holders)
    return backlog


class BacklogGauges(MaintenanceService):
    name = "backlog_gauges"
    failure = "backlog gauges not refreshed; trying again at the next housekeeping"

    async def run(self, store: Store) -> int:
        backlog = await refresh_backlog_gauges(store)
        return len(backlog.kinds)
