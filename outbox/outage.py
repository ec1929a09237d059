"""An attempt's writes ride out a database outage shorter than their time.

A restart or a failover of PostgreSQL breaks every connection of a pool, and for a moment no new
one can be made: a statement sent then fails with ``psycopg.OperationalError`` (a broken
connection, a refused or shutting-down server; the pool's ``PoolTimeout`` is one too). An
attempt whose take, fence or finish failed so would be lost with it: its action would wait for
its lease to run out (minutes), and an at-most-once action whose email had gone out would end
UNCERTAIN. Each of these writes is therefore sent again, after a pause that grows, until the
server answers or the write's own time is up (``sent_again``); then the failure is raised.

Sending one again is safe whatever became of the first, because each is fenced by its token's
epoch in the statement itself: a take is at most once an epoch (one whose reply was lost finds
its epoch taken, and the message is dropped as a twin delivery is); a fence whose reply was lost
passes again under the same epoch (the database checks the lease's margin itself); a finish that
committed before its connection broke finds its action ended, and is reported not recorded.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import psycopg

from outbox.fence_token import FenceToken

log = logging.getLogger("outbox.outage")

T = TypeVar("T")

#: What a database outage raises: a broken or refused connection, a server shutting down, no
#: connection from the pool in time (``psycopg_pool.PoolTimeout``), and the serialization and
#: deadlock failures that a write may simply send again.
OUTAGE = psycopg.OperationalError
#: The first pause before a write is sent again, and the longest: a restart takes seconds, and
#: a pool's broken connections are each found by one failed statement.
FIRST_PAUSE = 0.05
LONGEST_PAUSE = 1.0


async def sent_again(
    write: Callable[[], Awaitable[T]],
    error: BaseException,
    *,
    until: float,
    what: str,
    token: FenceToken,
) -> T:
    """After ``write()`` failed with ``error`` (one of ``OUTAGE``): sends it again, with a
    growing pause, until it answers, as long as another try can start before ``until``
    (``time.monotonic()``); past that, the last failure is raised. ``what`` (take, fence,
    finish) and ``token`` name it in the log. The first try is the caller's own, so that a
    write that answers, every write but in an outage, costs nothing more."""
    pause = FIRST_PAUSE
    tries = 1
    first_failure = time.monotonic()
    if until - first_failure <= pause:
        raise error
    log.warning(
        "%s of action %s epoch %s: PostgreSQL did not answer (%s); sending it again until it "
        "does, for up to %.1fs",
        what,
        token.action_id,
        token.epoch,
        _named(error),
        until - first_failure,
        extra={"event": "write_retried", "action_id": token.action_id, "what": what},
    )
    while True:
        await asyncio.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE)
        try:
            result = await write()
        except OUTAGE as again:
            tries += 1
            if until - time.monotonic() <= pause:
                log.warning(
                    "%s of action %s epoch %s: PostgreSQL still did not answer after %s tries; "
                    "its time is up (%s)",
                    what,
                    token.action_id,
                    token.epoch,
                    tries,
                    _named(again),
                )
                raise
            continue
        log.info(
            "%s of action %s epoch %s written after %s failed tries (%.1fs)",
            what,
            token.action_id,
            token.epoch,
            tries,
            time.monotonic() - first_failure,
            extra={"event": "write_rode_out", "action_id": token.action_id, "what": what},
        )
        return result


def _named(error: BaseException) -> str:
    """The error's class (and SQLSTATE), never its text: a connection error names hosts and
    users, and the outbox logs no exception's text (docs/operations.md, Logs)."""
    sqlstate = getattr(error, "sqlstate", None)
    return f"{type(error).__name__} {sqlstate}" if sqlstate else type(error).__name__
