"""The chaos soak's record of each attempt (``benchmarks.chaos.recording``) holds across a
database restart: the lane check reads an attempt's stop to know when its lane was free, so a
stop lost to the restart would turn a lane handed on correctly into a reported overlap."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest

from benchmarks.chaos import tables
from benchmarks.chaos.recording import Recorder
from benchmarks.chaos.servers import PrivatePostgres
from outbox.migrate import migrate

pytestmark = pytest.mark.slow

SCHEMAS = tables.Schemas("chaos_rec")
DOWNTIME = 1.0


@pytest.fixture
def recorded_postgres(private_postgres: PrivatePostgres) -> PrivatePostgres:
    """The private server with the soak's outbox and watch tables."""
    with psycopg.connect(private_postgres.url, autocommit=True) as conn:
        migrate(conn, SCHEMAS.outbox)
        tables.create(conn, SCHEMAS)
    return private_postgres


def _attempt_row(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            f'INSERT INTO "{SCHEMAS.watch}".attempt (action_id, epoch, attempt, kind, lane, pgid,'
            " pid, write_started) VALUES (1, 1, 1, 'email', 'mail-1', 1, 1, false) RETURNING id"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_stop_that_meets_the_database_down_is_written_once_it_is_back(
    recorded_postgres: PrivatePostgres,
) -> None:
    url = recorded_postgres.url
    row = _attempt_row(url)
    recorder = Recorder(url, SCHEMAS.watch)
    done_at = datetime.now(UTC)

    async def record() -> None:
        # The stop's write is in flight when the server goes down: it waits behind a lock on
        # its row (as it may wait behind the other processes on the cores).
        blocker = await psycopg.AsyncConnection.connect(url)
        try:
            await blocker.execute(f'SELECT 1 FROM "{SCHEMAS.watch}".attempt FOR UPDATE')
            stopping = asyncio.create_task(recorder.stop(row, "Done", done_at))
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as watcher:
                while not await _waits_on_a_lock(watcher):
                    await asyncio.sleep(0.05)
            recorded_postgres.stop()
            await asyncio.sleep(DOWNTIME)
            assert not stopping.done()
            # On this thread: the server dies with the thread that started it.
            recorded_postgres.start()
            await asyncio.wait_for(stopping, timeout=60)
        finally:
            # Nothing of the pool's or the connection's is left for the loop's end to cancel.
            await recorder.close()
            await blocker.close()

    asyncio.run(asyncio.wait_for(record(), timeout=120))
    with psycopg.connect(url) as conn:
        stopped = conn.execute(
            f'SELECT stopped_at, result FROM "{SCHEMAS.watch}".attempt WHERE id = %s', (row,)
        ).fetchone()
    # Stamped when the adapter was done, not when the database came back.
    assert stopped == (done_at, "Done")


async def _waits_on_a_lock(conn: psycopg.AsyncConnection[Any]) -> bool:
    cur = await conn.execute("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
    row = await cur.fetchone()
    return row is not None and row[0] > 0
