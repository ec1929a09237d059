"""How the outbox's processes connect to PostgreSQL: TCP keepalives, and waiting for a server
that is not up yet.

Keepalives (libpq's ``keepalives*`` parameters) let a process notice within about half a minute
that the server, or the network to it, is gone, instead of waiting on a dead socket for the
kernel's two hours. A server that is down when a claimer or worker starts is waited for with
backoff, each wait logged in one line, and a stop request ends the wait at once.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import psycopg

#: libpq connection parameters for every connection the outbox opens itself: probe an idle
#: connection after 10 s, every 5 s, and give it up after 3 unanswered probes; a connect that
#: gets no answer fails after 5 s.
CONNECTION_OPTIONS: dict[str, Any] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "connect_timeout": 5,
}
#: Waits between attempts to reach a server that is down: doubling up to the last.
BACKOFF = (0.25, 0.5, 1.0, 2.0, 5.0)


def backoff(attempt: int) -> float:
    """The wait after the ``attempt``-th failed try (0-based)."""
    return BACKOFF[min(attempt, len(BACKOFF) - 1)]


def one_line(error: BaseException) -> str:
    """An error as one short line for a log (a driver's message may span several)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text[:300]


async def sleep_unless_stopped(seconds: float, stop: asyncio.Event | None) -> bool:
    """Sleeps ``seconds``; False at once when ``stop`` is set meanwhile."""
    if stop is None:
        await asyncio.sleep(seconds)
        return True
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return True
    return False


async def wait_for_database(
    url: str, log: logging.Logger, stop: asyncio.Event | None = None, what: str = "PostgreSQL"
) -> bool:
    """Until a connection to ``url`` opens (True), or ``stop`` is set (False).

    Each failed try is logged as one line with the next wait; a stop request ends a try or a
    wait in progress at once.
    """
    attempt = 0
    while stop is None or not stop.is_set():
        connecting = asyncio.ensure_future(
            psycopg.AsyncConnection.connect(url, autocommit=True, **CONNECTION_OPTIONS)
        )
        stopped = asyncio.ensure_future(stop.wait()) if stop is not None else None
        try:
            await asyncio.wait(
                [connecting, *([stopped] if stopped else [])], return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            if stopped is not None:
                stopped.cancel()
        if not connecting.done():
            connecting.cancel()
            break
        try:
            conn = connecting.result()
        except (psycopg.Error, OSError) as error:
            wait = backoff(attempt)
            attempt += 1
            log.warning(
                "%s unreachable (try %s: %s); trying again in %ss",
                what,
                attempt,
                one_line(error),
                wait,
            )
            if not await sleep_unless_stopped(wait, stop):
                break
            continue
        await conn.close()
        if attempt:
            log.info("%s reachable after %s failed tries", what, attempt)
        return True
    return False
