"""An attempt's writes ride out a database outage shorter than their time: a restart of
PostgreSQL (every connection of the pool broken) while an attempt runs costs it nothing. Its
finish, its fence and a worker's take are written again once the server answers, as long as the
attempt's lease (for the fence, less the write margin) leaves room, so an email sent before the
restart ends DONE, not UNCERTAIN a lease later, and no attempt is spent on the outage. Each test
restarts a PostgreSQL of its own, never the shared one."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from datetime import timedelta
from typing import Any

import psycopg
import psycopg_pool
import pytest
from psycopg.rows import dict_row

from benchmarks.chaos.servers import PrivatePostgres
from outbox import (
    Abandoned,
    ActionAttempt,
    ActionKind,
    ActionRequest,
    Done,
    Outbox,
    enqueue,
)
from outbox import Result as ActionResult
from outbox.dispatch.runtime import WorkerRuntime
from outbox.fence_token import FenceToken
from outbox.outage import OUTAGE, sent_again

#: At most once: a finish lost after the fence would end it UNCERTAIN.
NOTICE = ActionKind("NOTICE", at_most_once=True)
LEASE = timedelta(seconds=120)
MARGIN = timedelta(seconds=10)
#: How long the server stays down.
DOWNTIME = 1.5
#: An attempt that rode the outage out ends this soon after the server is back (its lease is
#: two minutes: an attempt left to its lease would end that much later).
SOON = 15.0


class Gated:
    """Says it started; passes the fence (after ``before_fence`` opens, when gated), says so,
    waits for ``after_fence``, then reports the effect done; counts its calls."""

    def __init__(self, gate_before_fence: bool = False) -> None:
        self.before_fence = threading.Event()
        self.after_fence = threading.Event()
        self.started = threading.Event()
        self.fenced = threading.Event()
        self.gate_before_fence = gate_before_fence
        self.calls = 0

    async def execute(self, attempt: ActionAttempt) -> ActionResult:
        self.calls += 1
        self.started.set()
        if self.gate_before_fence:
            await asyncio.to_thread(self.before_fence.wait, 30)
        if not await attempt.fence().begin_write():
            return Abandoned()
        self.fenced.set()
        await asyncio.to_thread(self.after_fence.wait, 30)
        return Done(ref="sent")


def _outbox(server: PrivatePostgres, adapter: Gated) -> Outbox:
    outbox = Outbox(server.url, schema="outage", lease=LEASE, write_margin=MARGIN)
    outbox.register(NOTICE, adapter)
    outbox.migrate()
    return outbox


def _enqueued(server: PrivatePostgres) -> int:
    with psycopg.connect(server.url) as conn:
        action = enqueue(
            conn,
            ActionRequest(kind=NOTICE, workspace_id="w", lane_key="L", idempotency_key="k"),
            schema="outage",
        )
        conn.commit()
    return action.id


def _row(server: PrivatePostgres, action_id: int) -> dict[str, Any]:
    with psycopg.connect(server.url, row_factory=dict_row) as conn:
        row = conn.execute(
            "SELECT * FROM outage.agent_action WHERE id = %s", (action_id,)
        ).fetchone()
    assert row is not None
    return row


async def _run_one(outbox: Outbox) -> Any:
    """Claims the action in process and runs it."""
    async with outbox.store() as store:
        executor = outbox.executor(store)
        # The pool's connection is made before the restart, so the attempt meets it broken.
        async with store.pool.connection() as conn:
            await conn.execute("SELECT 1")
        started = time.monotonic()
        (claimed,) = await store.claim({NOTICE.name: 1}, outbox.settings.lease)
        return await executor.run(claimed, started)


def _in_background(run: Any) -> concurrent.futures.Future[Any]:
    """``run()`` in a thread of its own. The server is restarted from the test's own thread:
    a private server dies with the thread that started it."""
    executor = concurrent.futures.ThreadPoolExecutor(1)
    future = executor.submit(run)
    executor.shutdown(wait=False)
    return future


@pytest.mark.slow
def test_a_finish_that_meets_a_restarted_database_is_written_once_it_answers(
    private_postgres: PrivatePostgres,
) -> None:
    adapter = Gated()
    outbox = _outbox(private_postgres, adapter)
    action_id = _enqueued(private_postgres)

    running = _in_background(lambda: asyncio.run(_run_one(outbox)))
    assert adapter.fenced.wait(30)
    private_postgres.restart(downtime=DOWNTIME)
    back = time.monotonic()
    adapter.after_fence.set()
    outcome = running.result(timeout=60)
    assert outcome.recorded and time.monotonic() - back < SOON
    row = _row(private_postgres, action_id)
    assert (row["state"], row["attempt"], adapter.calls) == ("DONE", 1, 1), row


@pytest.mark.slow
def test_a_fence_asked_while_the_database_restarts_passes_once_it_answers(
    private_postgres: PrivatePostgres,
) -> None:
    adapter = Gated(gate_before_fence=True)
    adapter.after_fence.set()
    outbox = _outbox(private_postgres, adapter)
    action_id = _enqueued(private_postgres)

    running = _in_background(lambda: asyncio.run(_run_one(outbox)))
    assert adapter.started.wait(30)  # claimed, and the adapter waits before its fence
    private_postgres.stop()
    adapter.before_fence.set()  # the fence is asked while the server is down
    time.sleep(DOWNTIME)
    private_postgres.start()
    back = time.monotonic()
    outcome = running.result(timeout=60)
    assert outcome.recorded and time.monotonic() - back < SOON
    row = _row(private_postgres, action_id)
    # Passed, and the outage spent no attempt: one run, DONE.
    assert (row["state"], row["attempt"], adapter.calls) == ("DONE", 1, 1), row
    assert row["write_started_at"] is not None


@pytest.mark.slow
def test_a_worker_takes_a_message_that_came_while_the_database_restarted(
    private_postgres: PrivatePostgres,
) -> None:
    adapter = Gated()
    adapter.after_fence.set()
    outbox = _outbox(private_postgres, adapter)
    action_id = _enqueued(private_postgres)

    async def claim() -> Any:
        async with outbox.store() as store:
            (claimed,) = await store.claim({NOTICE.name: 1}, LEASE, take=False)
        return claimed.action.token

    token = asyncio.run(claim())
    runtime = WorkerRuntime(outbox)
    try:
        runtime.wait_ready(timeout=30)
        private_postgres.stop()
        # The message arrives while the server is down: its take waits for it.
        running = _in_background(lambda: runtime.run_many(NOTICE.name, [token]))
        time.sleep(DOWNTIME)
        private_postgres.start()
        back = time.monotonic()
        (outcome,) = running.result(timeout=60)
        assert time.monotonic() - back < SOON
    finally:
        runtime.stop()
    assert outcome is not None and outcome.recorded
    row = _row(private_postgres, action_id)
    assert (row["state"], row["attempt"], adapter.calls) == ("DONE", 1, 1), row


class _Failing:
    """A write that raises ``errors`` in turn, then answers."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "written"


TOKEN = FenceToken(7, 1)


async def _first_try(write: _Failing, until: float, what: str = "finish") -> str:
    """As the writes' callers do: the first try, then ``sent_again`` after an outage's error."""
    try:
        return await write()
    except OUTAGE as error:
        return await sent_again(write, error, until=until, what=what, token=TOKEN)


async def test_only_what_an_outage_raises_is_sent_again() -> None:
    until = time.monotonic() + 30
    through = _Failing(psycopg.errors.AdminShutdown(), psycopg_pool.PoolTimeout())
    assert await _first_try(through, until) == "written"
    assert through.calls == 3
    refused = _Failing(psycopg.errors.AdminShutdown(), psycopg.errors.CheckViolation())
    with pytest.raises(psycopg.errors.CheckViolation):
        await _first_try(refused, until)
    assert refused.calls == 2


async def test_an_outage_longer_than_the_writes_time_is_raised_when_its_time_is_up() -> None:
    endless = _Failing(*(psycopg.OperationalError("down") for _ in range(1000)))
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        await _first_try(endless, started + 0.5, "take")
    assert 0.3 <= time.monotonic() - started < 2.0
    assert 3 <= endless.calls < 20
    # A write whose time is already up is not sent again at all.
    late = _Failing(psycopg.OperationalError("down"))
    with pytest.raises(psycopg.OperationalError):
        await _first_try(late, time.monotonic())
    assert late.calls == 1
