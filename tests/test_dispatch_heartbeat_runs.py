"""A heartbeat row keeps when its process's unbroken run of beats began (``beating_since``): a
beat at most 1.5 intervals after the last goes on with it, a later one (it waited through a
database outage, or its process stalled) starts a new run. A claimer judges other processes
lost only while its own run has lasted as long as their silence
(``outbox.maintenance.lost_processes``)."""

from __future__ import annotations

import asyncio
from datetime import datetime

import psycopg
from dispatch_support import app_schema

from outbox.dispatch.heartbeat import Heartbeat
from outbox.operator.processes import BEAT_GAP

INTERVAL = 0.2


def _run_began(database_url: str, schema: str, process_id: str) -> datetime | None:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            f'SELECT beating_since FROM "{schema}".outbox_process WHERE process_id = %s',
            [process_id],
        ).fetchone()
    assert row is not None
    began: datetime | None = row[0]
    return began


async def test_a_run_of_beats_goes_on_while_each_is_in_time_and_starts_again_after_a_late_one(
    database_url: str, schema: str
) -> None:
    outbox = app_schema(database_url, schema).outbox()
    async with outbox.store() as store:
        heartbeat = Heartbeat(store, "claimer", ["K"], lambda: 0, INTERVAL)
        assert await heartbeat.beat()
        first = _run_began(database_url, schema, heartbeat.process_id)
        for _ in range(3):
            await asyncio.sleep(INTERVAL)
            assert await heartbeat.beat()
        assert first is not None
        assert _run_began(database_url, schema, heartbeat.process_id) == first

        await asyncio.sleep(BEAT_GAP * INTERVAL + 0.2)
        assert await heartbeat.beat()
        again = _run_began(database_url, schema, heartbeat.process_id)
        assert again is not None
        assert (again - first).total_seconds() >= 3 * INTERVAL + BEAT_GAP * INTERVAL

        # A row written before the column existed starts its run at its next beat.
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'UPDATE "{schema}".outbox_process SET beating_since = NULL')
        assert await heartbeat.beat()
        assert _run_began(database_url, schema, heartbeat.process_id) is not None
