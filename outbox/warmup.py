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
changes nothing. Its parameters are built by the store's own builders and sent as the store sends
them (``outbox.store``: one type a parameter whatever its value), so the statement prepared here
is the one every later run of it on the connection uses: the first attempt skips planning too.
A connection whose warm-up fails (a schema not migrated yet) is still handed out: the attempt's
own statement then reports what is wrong.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import AsyncConnection

from outbox._io import Operation, Statement, run_async
from outbox.fence_token import FenceToken
from outbox.queries import queries_for
from outbox.store import (
    claim_heads_statement,
    fence_params,
    fences_params,
    finishes_params,
    take_params,
    takes_params,
)

log = logging.getLogger("outbox.warmup")

#: An action no row has (ids start at 1).
_NO_ACTION = FenceToken(0, 0)
#: A claim's time, as an attempt's fence gives it: a value, not NULL, which psycopg would send
#: untyped (another prepared statement than the attempts').
_CLAIMED_AT = datetime(2000, 1, 1, tzinfo=UTC)


def _statements(schema: str, lease: timedelta) -> dict[str, Statement]:
    """Each statement an attempt runs (take, fence, finish; one row and a batch), and a claim's
    (of no kind, up to none), as the store runs them, with parameters that match no action."""
    q = queries_for(schema)
    claim = {"kind": "", "limit": 0, "lease": lease, "take": False}
    attempts: dict[str, Mapping[str, Any]] = {
        "take_attempt": take_params(_NO_ACTION, lease),
        "take_attempts": takes_params([], lease),
        "begin_write": fence_params((_NO_ACTION, timedelta(0), None, _CLAIMED_AT)),
        "begin_writes": fences_params([]),
        "finish_many": finishes_params([]),
    }
    return {
        "claim_heads": claim_heads_statement(q, claim, 0, None, {}, reclaim=False),
        **{name: Statement(q[name], params, prepare=True) for name, params in attempts.items()},
    }


async def use_generic_plans(conn: AsyncConnection[Any]) -> None:
    """``conn``'s session plans each prepared statement once, generically
    (``Outbox.store(generic_plans=True)``)."""
    await conn.execute("SET plan_cache_mode = force_generic_plan")


def _one(statement: Statement) -> Operation[None]:
    yield statement


async def warm_connection(conn: AsyncConnection[Any], schema: str, lease: timedelta) -> None:
    """Runs (and prepares) a claim's and each of an attempt's statements once on ``conn``,
    changing nothing."""
    for name, statement in _statements(schema, lease).items():
        try:
            await run_async(conn, _one(statement))
        except psycopg.Error as error:
            log.debug("warm-up of a new connection stopped at %s: %s", name, error)
            if not conn.autocommit:
                await conn.rollback()
            return
