"""Retention: an ended action is deleted ``Settings.retention`` (30 days) after it ended.

Pruning runs in small batches, each one short statement (``prune_ended`` in
``sql/queries.sql``) that takes the oldest ended rows with ``FOR UPDATE SKIP LOCKED`` and deletes
them. So a prune never waits for a row somebody else holds, and it locks only ended rows, which no
claim, fence or finish ever locks (they all match live states only): a claim never waits on a
prune. The claimer's ``Retention`` service runs ``prune_async`` (at most ``HOUSEKEEPING_BATCHES``
batches a turn); ``outbox prune`` runs ``prune`` to the end. ``outbox.retention`` re-exports the
functions.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from psycopg import Connection, pq

from outbox._io import Operation, Statement, run_sync
from outbox.enqueuing import default_schema
from outbox.errors import ConfigurationError
from outbox.maintenance.service import MaintenanceService
from outbox.queries import queries_for
from outbox.rate_limiter import prune_buckets_operation

if TYPE_CHECKING:
    from outbox.store import Store

# The logger operators already filter on, whichever module prunes.
log = logging.getLogger("outbox.retention")

#: Rows one batch deletes: small enough that a batch is over in milliseconds and holds few locks.
DEFAULT_BATCH_SIZE = 500
#: Batches one turn of the claimer's ``Retention`` runs at most, so a large first prune is spread
#: over turns instead of delaying the claim round that follows.
HOUSEKEEPING_BATCHES = 10


def prune_batch_operation(schema: str, retention: timedelta, limit: int) -> Operation[int]:
    """Deletes up to ``limit`` actions that ended more than ``retention`` ago; returns the count."""
    if retention < timedelta(0):
        raise ConfigurationError(f"retention must not be negative, got {retention}")
    if limit < 1:
        raise ConfigurationError(f"batch size must be >= 1, got {limit}")
    rows = yield Statement(
        queries_for(schema)["prune_ended"], {"retention": retention, "limit": limit}
    )
    return len(rows)


def _log_pruned(total: int, batches: int, retention: timedelta) -> None:
    if total:
        log.info(
            "pruned %d ended actions in %d batches",
            total,
            batches,
            extra={
                "event": "pruned",
                "pruned": total,
                "batches": batches,
                "retention_seconds": retention.total_seconds(),
            },
        )


async def prune_async(
    store: Store,
    retention: timedelta,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batches: int | None = None,
) -> int:
    """Deletes actions ended more than ``retention`` ago, batch by batch, each batch its own
    autocommit statement on ``store``'s pool. Stops when a batch comes back short (nothing older
    is left, or only rows others hold) or after ``max_batches``. Returns how many it deleted."""
    total = batches = 0
    while max_batches is None or batches < max_batches:
        deleted = await store.run(prune_batch_operation(store.schema, retention, batch_size))
        total += deleted
        batches += 1
        if deleted < batch_size:
            break
    _log_pruned(total, batches, retention)
    return total


def prune(
    conn: Connection[Any],
    retention: timedelta,
    *,
    schema: str | None = None,
    batch_size: int = DEFAULT_BATCH_SIZE,
    max_batches: int | None = None,
) -> int:
    """The sync twin of ``prune_async`` on one connection; every batch is committed on its own.

    ``conn`` must not be inside a transaction (this commits): give it an idle connection, not
    the application's unit of work.
    """
    if not conn.autocommit and conn.info.transaction_status != pq.TransactionStatus.IDLE:
        raise ConfigurationError("prune commits each batch: call it outside a transaction")
    name = schema or default_schema()
    total = batches = 0
    while max_batches is None or batches < max_batches:
        deleted = run_sync(conn, prune_batch_operation(name, retention, batch_size))
        if not conn.autocommit:
            conn.commit()
        total += deleted
        batches += 1
        if deleted < batch_size:
            break
    _log_pruned(total, batches, retention)
    return total


class Retention(MaintenanceService):
    """Prunes actions ended more than ``retention`` ago, at most ``max_batches`` batches a turn."""

    name = "retention"
    failure = "prune failed; trying again at the next housekeeping"

    def __init__(
        self,
        interval: timedelta,
        retention: timedelta,
        *,
        batch_size: int = DEFAULT_BATCH_SIZE,
        max_batches: int = HOUSEKEEPING_BATCHES,
    ) -> None:
        super().__init__(interval)
        self.retention = retention
        self.batch_size = batch_size
        self.max_batches = max_batches

    async def run(self, store: Store) -> int:
        pruned = await prune_async(
            store, self.retention, batch_size=self.batch_size, max_batches=self.max_batches
        )
        # Rate buckets of limit keys nobody used for a day (one short DELETE of a small table).
        await store.run(prune_buckets_operation(store.schema))
        return pruned

    def behind(self, handled: int) -> bool:
        return handled >= self.batch_size * self.max_batches
