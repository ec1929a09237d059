"""Retention's public functions (``outbox prune`` and code call these); the implementation and
the claimer's service live in ``outbox.maintenance.retention``."""

from outbox.maintenance.retention import (
    DEFAULT_BATCH_SIZE,
    HOUSEKEEPING_BATCHES,
    prune,
    prune_async,
    prune_batch_operation,
)

__all__ = [
    "DEFAULT_BATCH_SIZE",
    "HOUSEKEEPING_BATCHES",
    "prune",
    "prune_async",
    "prune_batch_operation",
]
