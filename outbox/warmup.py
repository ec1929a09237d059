"""A new connection of the executing side runs a claim's and an attempt's statements once,
touching no row, before it serves.

A PostgreSQL backend's first run of a statement loads the catalog entries of every table,
index, trigger and function it touches and compiles the trigger functions it fires (the lane
tracker fires on an update of no row as well): 5 to 10 ms for a finish, against well under a
millisecond once warm. Without this, the first attempts on each new connection of a worker's pool
paid that: from the take to the adapter's start, up to 24 ms for the first actions after a
worker started, against about 1 ms after. The statements are prepared here too, so that their
first real runs skip parsing.

Every statement below is given an empty batch, or an id no action has (0: ids start at 1), so it
changes nothing. A connection whose warm-up fails (a schema not migrated yet) is still handed
out: the attempt's own statement then reports what is wrong.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import AsyncConnection

from outbox.queries import queries_for

log = logging.getLogger("outbox.warmup")

_NO_ACTION = {"id": 0, "epoch": 0}
#: The finish's arrays besides ids and epochs.
_FINISH_ARRAYS = (
    "states",
    "stop_reasons",
    "refs",
    "retry_reasons",
    "afters",
    "gives_back",
    "error_classes",
    "claimed_ats",
    "fenced",
    "hand_offs",
)


def _no_batch(*arrays: str) -> dict[str, list[Any]]:
    return {name: [] for name in ("ids", "epochs", *arrays)}


def _statements(lease: timedelta) -> dict[str, dict[str, Any]]:
    """Each statement an attempt runs (take, fence, finish; one row and a batch), and a claim's,
    with parameters that match no action (the claim: of no kind, up to none)."""
    return {
        "claim_heads": {
            "kind": "",
            "limit": 0,
            "lease": lease,
            "take": False,
            "reclaim": False,
            "heads": True,
            "keys": None,
            "after": "",
            "walk": 1,
            "per_key": None,
            "key_cap": None,
        },
        "take_attempt": {**_NO_ACTION, "lease": lease},
        "take_attempts": {**_no_batch(), "lease": lease},
        "begin_write": {**_NO_ACTION, "margin": timedelta(0), "ref": None, "claimed_at": None},
        "begin_writes": _no_batch("margins", "refs", "claimed_ats"),
        "finish_many": _no_batch(*_FINISH_ARRAYS),
    }


async def use_generic_plans(conn: AsyncConnection[Any]) -> None:
    """``conn``'s session plans each prepared statement once, generically
    (``Outbox.store(generic_plans=True)``)."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")


async def warm_connection(conn: AsyncConnection[Any], schema: str, lease: timedelta) -> None:
    """Runs (and prepares) a claim's and each of an attempt's statements once on ``conn``,
    changing nothing."""
    queries = queries_for(schema)
    for name, params in _statements(lease).items():
        try:
            await conn.execute(queries[name], params, prepare=True)
        except psycopg.Error as error:
            log.debug("warm-up of a new connection stopped at %s: %s", name, error)
            if not conn.autocommit:
                await conn.rollback()
            return
