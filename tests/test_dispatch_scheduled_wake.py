"""An idle claimer wakes as the soonest scheduled action of its kinds comes due (a ``not_before``,
a retry's back-off), not at its next poll: a scheduled send runs on time whatever the poll."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

import psycopg

from outbox import ActionRequest
from outbox.dispatch import Claimer, broker_from_url, install
from tests.apps import dispatch_app

#: Far longer than the test may take: a claim that comes from the poll fails it.
POLL = 60.0


async def test_an_idle_claimer_claims_a_scheduled_action_as_it_comes_due(
    make_outbox, schema: str, redis_url: str
) -> None:
    url = make_outbox().settings.require_database_url()
    outbox = dispatch_app.build(url, schema, schema.upper(), poll_interval=timedelta(seconds=POLL))
    outbox.migrate()
    rb, _ = dispatch_app.kinds(schema.upper())
    dispatch = install(outbox, broker_from_url(redis_url))
    lease = outbox.settings.lease

    def enqueue_for_soon() -> tuple[int, object]:
        with psycopg.connect(url) as conn:
            (when,) = conn.execute("SELECT now() + interval '1.5 seconds'").fetchone() or (None,)
            request = ActionRequest(
                rb, lane_key="l", idempotency_key="k", workspace_id="w", not_before=when
            )
            return outbox.enqueue(conn, request).id, when

    def claimed_at(action_id: int) -> object:
        with psycopg.connect(url) as conn:
            row = conn.execute(
                f'SELECT lease_until FROM "{schema}".agent_action WHERE id = %s', (action_id,)
            ).fetchone()
            assert row is not None
            return row[0] - lease

    stop = asyncio.Event()
    async with outbox.store() as store:
        claimer = Claimer(dispatch, store)
        running = asyncio.create_task(claimer.run(stop))
        try:
            await asyncio.sleep(0.3)  # its first round found nothing: it waits
            action_id, due = await asyncio.to_thread(enqueue_for_soon)
            # The enqueue's NOTIFY woke a round that found nothing due; it waits for the time.
            started = time.monotonic()
            while claimer.totals["pushed"] < 1:
                assert time.monotonic() - started < 5, "not claimed within 3.5 s of its time"
                await asyncio.sleep(0.01)
            late = (await asyncio.to_thread(claimed_at, action_id)) - due  # type: ignore[operator]
            # Never early (by the database's clock), and well within a poll of its time.
            assert timedelta(0) <= late < timedelta(seconds=0.5), late
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)
