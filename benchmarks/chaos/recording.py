"""What the adapters record of each attempt, for the checks: when it ran, in which process group,
when it asked its fence and what the fence said.

Each write is one autocommit statement on a pool of its own (never the outbox's, never inside an
action's transaction), so a row is either committed before a kill or absent. The order of the
writes is what makes the checks sound:

- ``start`` commits before the adapter does anything, so an attempt without a row did nothing;
- ``fence_asked_at`` commits before ``begin_write()`` is called, so a fence that passed was asked
  no earlier than that time (an erasure committed before it must make the fence refuse);
- ``stop`` commits after the adapter is done and before the executor writes its result (it is
  retried until the database takes it), so an attempt without ``stopped_at`` was killed or cut
  (its process group's kill time or its deadline closes its interval). Its time is read in the
  process as the adapter is done, not by the server as the row is written: the write may wait
  (for a connection a database restart broke, or behind the other processes on the cores), and
  a stop stamped then stretched the interval past the next attempt's start. Every process of
  the soak and its PostgreSQL run on one machine, so the two clocks are one.

Each process also records when its event loop ran a timer late (``stall``): a lease's cut is a
loop timer, so a loop the machine starved cuts its attempt as late, and the checks may find an
attempt that stopped after its lease's end.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from contextlib import suppress
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from outbox import ActionAttempt, Result

#: How often each process's loop is sampled, and how late a sample must be to count as a stall.
STALL_SAMPLE = 0.05
STALL = 0.1
#: How long a stop that met the database down waits before it is written again.
STOP_RETRY = 0.1


class Recorder:
    """One per process; opens its pool on first use, on the loop that uses it."""

    def __init__(self, database_url: str, watch_schema: str) -> None:
        self.database_url = database_url
        self.t = f'"{watch_schema}".attempt'
        self.stalls = f'"{watch_schema}".stall'
        self._pool: AsyncConnectionPool | None = None
        self._pid = 0
        # Guards opening the pool only (concurrent first attempts of one process).
        self._lock = asyncio.Lock()
        self._watched: tuple[asyncio.AbstractEventLoop, int] | None = None
        self._watching: set[asyncio.Task[None]] = set()

    async def _execute(self, query: str, params: tuple[Any, ...]) -> list[tuple[Any, ...]]:
        async with self._lock:
            if self._pool is None or self._pid != os.getpid():
                pool = AsyncConnectionPool(
                    self.database_url,
                    min_size=1,
                    max_size=4,
                    kwargs={"autocommit": True},
                    # A connection a database restart broke is replaced before it is used.
                    check=AsyncConnectionPool.check_connection,
                    open=False,
                )
                await pool.open(wait=True)
                self._pool, self._pid = pool, os.getpid()
        async with self._pool.connection() as conn:
            cur = await conn.execute(query, params)
            return await cur.fetchall() if cur.description else []

    async def close(self) -> None:
        """Closes the pool, if this process opened one (the soak's processes are killed or exit
        with theirs; a test closes it before its loop ends)."""
        if self._pool is not None and self._pid == os.getpid():
            await self._pool.close()
        self._pool = None

    def watch_loop(self) -> None:
        """Starts sampling the running loop's lateness, once a loop (the first attempt on it)."""
        loop = asyncio.get_running_loop()
        if self._watched == (loop, os.getpid()):
            return
        self._watched = (loop, os.getpid())
        task = loop.create_task(self._sample_stalls(loop))
        self._watching.add(task)
        task.add_done_callback(self._watching.discard)

    async def _sample_stalls(self, loop: asyncio.AbstractEventLoop) -> None:
        while True:
            due = loop.time() + STALL_SAMPLE
            await asyncio.sleep(STALL_SAMPLE)
            lag = loop.time() - due
            if lag > STALL:
                # Written beside the sampling, not awaited: the write may wait as long again.
                write = loop.create_task(self._stall(datetime.now(UTC), lag))
                self._watching.add(write)
                write.add_done_callback(self._watching.discard)

    async def _stall(self, resumed_at: datetime, lag: float) -> None:
        with suppress(psycopg.Error, OSError):
            await self._execute(
                f"INSERT INTO {self.stalls} (pid, resumed_at, lag) VALUES (%s, %s, %s)",
                (os.getpid(), resumed_at, lag),
            )

    async def start(self, attempt: ActionAttempt) -> int:
        rows = await self._execute(
            f"INSERT INTO {self.t} (action_id, epoch, attempt, kind, lane, pgid, pid,"
            " write_started, deadline) VALUES (%s, %s, %s, %s, %s, %s, %s, %s,"
            " clock_timestamp() + make_interval(secs => %s)) RETURNING id",
            (
                attempt.id,
                attempt.epoch,
                attempt.attempt,
                attempt.kind,
                attempt.lane_key,
                os.getpgid(0),
                os.getpid(),
                attempt.write_started,
                attempt.time_left(),
            ),
        )
        return int(rows[0][0])

    async def fence_asked(self, row: int) -> None:
        await self._execute(
            f"UPDATE {self.t} SET fence_asked_at = clock_timestamp() WHERE id = %s", (row,)
        )

    async def fence_answered(self, row: int, passed: bool) -> None:
        # Not written while the database is down (a restart): the row keeps fence_passed NULL,
        # which the checks take as "may have passed". Raising here, after a fence that passed,
        # would turn the soak's own bookkeeping into the adapter's error.
        with suppress(psycopg.Error, OSError):
            await self._execute(
                f"UPDATE {self.t} SET fence_passed = %s WHERE id = %s", (passed, row)
            )

    async def stop(self, row: int, result: str, at: datetime) -> None:
        """``at``: when the adapter was done (the process's clock).

        Retried until it is written, so that it commits before the executor's finish can (both
        wait for the same database): a stop lost to a restart while the finish, retried, went
        through released the lane with the attempt still open in the record, and a kill of the
        process later stretched its interval over the next action of its lane. A kill or a cut
        during the retries leaves the interval to its process's end or its deadline, both of
        which come before the lane can be claimed again (the finish was not written)."""
        while True:
            try:
                await self._execute(
                    f"UPDATE {self.t} SET stopped_at = %s, result = %s WHERE id = %s",
                    (at, result, row),
                )
                return
            except (psycopg.Error, OSError):
                await asyncio.sleep(STOP_RETRY)


class RecordedFence:
    """The attempt's own fence, with its question and answer recorded, and an optional pause
    after it passes (so that some kills land between the fence and the finish)."""

    def __init__(self, attempt: ActionAttempt, recorder: Recorder, row: int, linger: float):
        self._attempt = attempt
        self._recorder = recorder
        self._row = row
        self._linger = linger

    async def begin_write(self, provider_ref: str | None = None) -> bool:
        await self._recorder.fence_asked(self._row)
        passed = await self._attempt.fence().begin_write(provider_ref)
        # Shielded: a lease's cut that lands in this write stops the adapter at once, not after
        # psycopg cancelled the statement on the server (a round trip, more when it is down),
        # which would stamp the attempt's stop later than the adapter stopped.
        await asyncio.shield(self._recorder.fence_answered(self._row, passed))
        if passed and self._linger > 0:
            await asyncio.sleep(self._linger)
        return passed


class RecordedAttempt:
    """An ``ActionAttempt`` as an adapter sees it, whose ``fence()`` is a ``RecordedFence``.

    Everything else is the real attempt's (the executor still sees the fence pass on it).
    """

    def __init__(self, attempt: ActionAttempt, fence: RecordedFence) -> None:
        self._real = attempt
        self._fence = fence

    def fence(self) -> RecordedFence:
        return self._fence

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


async def run_recorded(
    recorder: Recorder,
    attempt: ActionAttempt,
    linger: float,
    execute: Callable[[Any], Awaitable[Result]],
    linger_after: float = 0.0,
) -> Result:
    """Runs ``execute(recorded_attempt)`` between a committed start row and a committed stop
    row (the stop also when the executor cancels the attempt at its deadline). ``linger_after``
    pauses after the adapter returned, before the executor writes its result: a window for
    kills between a provider's answer and the finish."""
    recorder.watch_loop()
    row = await recorder.start(attempt)
    outcome = "raised"
    try:
        result = await execute(
            RecordedAttempt(attempt, RecordedFence(attempt, recorder, row, linger))
        )
        outcome = type(result).__name__
        if linger_after > 0:
            await asyncio.sleep(linger_after)
        return result
    except asyncio.CancelledError:
        outcome = "cancelled"
        raise
    finally:
        await recorder.stop(row, outcome, datetime.now(UTC))
