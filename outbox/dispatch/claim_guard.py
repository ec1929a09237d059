"""Bounds on a claim round's transaction, so no claimer holds up another for long.

A claim round holds a transaction-scoped advisory lock (``claim_lock``) while it counts and
claims. A claimer paused (SIGSTOP, a long GC, a stalled VM) or cut off while it holds the lock
would stop every other claimer of the schema. ``claim_round_guard`` opens each round's
transaction with LOCAL server-side bounds:

- ``idle_in_transaction_session_timeout``: the server ends the session of a claimer that sits
  idle inside its round (paused or cut off), which frees the lock and rolls its claims back;
- ``lock_timeout``: a round waits at most this long for the lock, then gives up and tries again;
- ``statement_timeout``: no statement of a round runs longer.

The waiting side logs how long it waited; a wait that timed out is logged and raised as
``ClaimLockBusy`` (the claimer tries again).

A round is two round trips: ``open_claim_round`` (BEGIN, the bounds and the lock, the round's
first look) and ``close_claim_round`` (each kind's claim and the COMMIT, pipelined).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import AsyncClientCursor, AsyncConnection
from psycopg.rows import dict_row

from outbox._io import Rows, Statement, commit_pipelined, returned_rows
from outbox.config import Settings
from outbox.queries import queries_for

log = logging.getLogger("outbox.claimer")

#: A wait for the claim lock at least this long is logged: replicas' rounds take milliseconds.
LOCK_WAIT_LOGGED = 0.25


class ClaimLockBusy(Exception):
    """Another claimer held the claim lock for longer than ``claim_lock_timeout``."""


def _ms(value: timedelta) -> str:
    return f"{max(1, round(value.total_seconds() * 1000))}ms"


def guard_statement(schema: str, settings: Settings) -> Statement:
    """``claim_round_guard`` with the round's bounds from ``settings``."""
    params = {
        "schema": schema,
        "lock_timeout": _ms(settings.claim_lock_timeout),
        "statement_timeout": _ms(settings.claim_statement_timeout),
        "idle_timeout": _ms(settings.claim_idle_timeout),
    }
    return Statement(queries_for(schema)["claim_round_guard"], params)


async def open_claim_round(
    conn: AsyncConnection[Any], schema: str, settings: Settings, first: Statement
) -> Rows:
    """Opens the round's transaction on ``conn`` (autocommit), sets its bounds, takes the claim
    lock and runs the round's ``first`` statement, in one round trip;
    returns the rows of ``first``. Raises ``ClaimLockBusy``.

    The three go as one simple-protocol query (parameters bound client-side), whose statements
    the server runs in order, each with a snapshot of its own: ``first`` sees every claim
    committed before the lock was granted. The query ends with the server ready for the next
    command, so it arms ``idle_in_transaction_session_timeout`` at once: a claimer paused
    right after it, holding the lock, is still ended by the server. (A pipeline does not do
    for this: psycopg may end one with a flush request after its Sync, and any message after
    the server's last ready-for-query leaves that timer disarmed until the next Sync.)
    """
    started = time.monotonic()
    async with AsyncClientCursor(conn, row_factory=dict_row) as cur:
        query = _opening_query(cur, schema, settings, first)
        with _lock_wait(settings, started):
            await cur.execute(query)
        while cur.nextset():
            pass  # to the last statement's result: ``first``'s
        rows = await cur.fetchall() if returned_rows(cur) else []
    _waited(started)
    return rows


async def close_claim_round(conn: AsyncConnection[Any], claims: list[Statement]) -> list[Rows]:
    """Runs the round's ``claims`` and its COMMIT in one round trip (``commit_pipelined``);
    returns each claim's rows, in order. With no claim, it only commits. Either way the round's
    transaction, and the claim lock with it, is over when it returns or raises: committed, or
    rolled back and the claim's error raised."""
    if not claims:
        await conn.commit()
        return []
    return await commit_pipelined(conn, claims, begin=False)


#: Opening queries kept bound: a claimer's are the same every round (its bounds, its kinds), and
#: binding the values client-side was about 7% of its CPU a round. Bounded, as a key holds the
#: first statement's values.
_OPENINGS_KEPT = 64
_openings: dict[tuple[str, ...], str] = {}


def _opening_query(
    cur: AsyncClientCursor[Any], schema: str, settings: Settings, first: Statement
) -> str:
    """BEGIN, the guard and ``first`` as one query, their values bound (``mogrify``)."""
    guard = guard_statement(schema, settings)
    key = (
        cur.connection.info.encoding,
        repr(guard.params),
        first.sql,
        repr(first.params),
    )
    query = _openings.get(key)
    if query is None:
        begin = Statement(queries_for(schema)["begin"])
        query = ";\n".join(cur.mogrify(s.sql, s.params) for s in (begin, guard, first))
        if len(_openings) >= _OPENINGS_KEPT:
            _openings.clear()
        _openings[key] = query
    return query


@contextmanager
def _lock_wait(settings: Settings, started: float) -> Iterator[None]:
    """Turns a lock wait that timed out into ``ClaimLockBusy``, logged."""
    try:
        yield
    except psycopg.errors.LockNotAvailable:
        waited = time.monotonic() - started
        log.warning(
            "claim lock not granted after %.1fs: another claimer holds it (paused or cut off; "
            "the server ends its session after %ss idle); trying again",
            waited,
            settings.claim_idle_timeout.total_seconds(),
        )
        raise ClaimLockBusy(f"claim lock not granted within {waited:.1f}s") from None


def _waited(started: float) -> float:
    waited = time.monotonic() - started
    if waited >= LOCK_WAIT_LOGGED:
        log.warning("waited %.1fs for the claim lock another claimer held", waited)
    return waited
