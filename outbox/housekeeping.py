"""The operator's share of the claimer's housekeeping timer: retention and the backlog gauges.

The claimer calls ``operations_housekeeping`` next to its lease and expiry housekeeping. Both
parts are short: at most ``HOUSEKEEPING_BATCHES`` small prune batches (SKIP LOCKED), and three
reads for the gauges. A failure of either is logged and left to the next tick, so it never stops
the claimer from claiming.
"""

from __future__ import annotations

import logging

import psycopg

from outbox.config import Settings
from outbox.metrics import refresh_backlog_gauges
from outbox.retention import HOUSEKEEPING_BATCHES, prune_async
from outbox.store import Store

log = logging.getLogger("outbox.housekeeping")


async def operations_housekeeping(store: Store, settings: Settings) -> int:
    """Prunes actions ended more than ``settings.retention`` ago (bounded per tick) and refreshes
    the backlog gauges. Returns how many actions it pruned."""
    pruned = 0
    try:
        pruned = await prune_async(store, settings.retention, max_batches=HOUSEKEEPING_BATCHES)
    except psycopg.Error:
        log.exception("prune failed; trying again at the next housekeeping")
    try:
        await refresh_backlog_gauges(store)
    except psycopg.Error:
        log.exception("backlog gauges not refreshed; trying again at the next housekeeping")
    return pruned
