"""The executor: each result maps to one fenced finish, exceptions map by the fence, leases hold."""

from __future__ import annotations

import asyncio
import gc
import time
from datetime import timedelta

import psycopg
import pytest

from outbox import (
    Abandoned,
    ActionKind,
    ActionRequest,
    ActionState,
    AdapterAlreadyRegistered,
    Cancelled,
    Defer,
    Done,
    DrainDidNotSettle,
    Failed,
    Retry,
    StopReason,
    TransactionOpenError,
    Uncertain,
    enqueue,
)
from outbox.attempt import ActionAttempt
from outbox.results import finish_for
from outbox.store import held_connections
from outbox.testing import drain, drain_async
from tests.support import Recorder, ScriptedAdapter, rows

NOTE = ActionKind("NOTE")
ONCE = ActionKind("ONCE", at_most_once=True)


def build(make_outbox, adapter, kind=NOTE, **settings):
    ob = make_outbox(**settings)
    ob.register(kind, adapter)
    ob.migrate()
    return ob


def put(ob, database_url, n=1, kind=NOTE, lane=None, **fields):
    with psycopg.connect(database_url) as conn:
        actions = [
            enqueue(
                conn,
                ActionRequest(
                    kind,
                    lane_key=lane or f"lane-{i}",
                    idempotency_key=f"key-{i}",
                    workspace_id="w",
                    payload={"i": i},
                    **fields,
                ),
                schema=ob.schema,
            )
            for i in range(n)
        ]
        conn.commit()
    return actions


def one_row(database_url, schema):
    with psycopg.connect(database_url) as conn:
        (row,) = rows(conn, schema)
        return row


@pytest.mark.parametrize(
    ("result", "state", "reason", "ref"),
    [
        (Done("provider-42"), "DONE", "DONE", "provider-42"),
        (Failed("REJECTED"), "FAILED", "REJECTED", None),
        (Cancelled("NOBODY_TO_TELL"), "CANCELLED", "NOBODY_TO_TELL", None),
        (Uncertain("TIMEOUT"), "UNCERTAIN", "TIMEOUT", None),
    ],
)
def test_each_ending_result_is_one_recorded_end(
    make_outbox, database_url, schema, result, state, reason, ref
):
    ob = build(make_outbox, ScriptedAdapter(lambda a: result))
    put(ob, database_url)
    report = drain(ob)
    assert [(o.result, o.recorded, o.state) for o in report.outcomes] == [
        (result, True, ActionState(state))
    ]
    row = one_row(database_url, schema)
    assert (row["state"], row["stop_reason"], row["readback_ref"]) == (state, reason, ref)
    assert row["payload"] is None and row["ended_at"] is not None
    assert (row["epoch"], row["attempt"]) == (1, 1)


def test_uncertain_writes_one_warning_with_kind_and_reason(make_outbox, database_url, caplog):
    ob = build(make_outbox, ScriptedAdapter(lambda a: Uncertain("RELAY_TIMEOUT")))
    (action,) = put(ob, database_url)
    drain(ob)
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "NOTE" in warnings[0].getMessage() and "RELAY_TIMEOUT" in warnings[0].getMessage()
    assert str(action.id) in warnings[0].getMessage()


def test_retry_runs_again_until_max_attempts_then_fails_exhausted(
    make_outbox, database_url, schema
):
    adapter = ScriptedAdapter(lambda a: Retry())
    ob = build(make_outbox, adapter)
    put(ob, database_url, max_attempts=3)
    report = drain(ob)
    assert report.count() == {"retry": 3}
    row = one_row(database_url, schema)
    assert (row["state"], row["stop_reason"], row["attempt"]) == (
        "FAILED",
        StopReason.ATTEMPTS_EXHAUSTED,
        3,
    )
    assert [a.attempt for a in adapter.recorder.attempts] == [1, 2, 3]


def test_retry_waits_with_backoff_and_clears_the_fence(make_outbox, database_url, schema):
    ob = build(make_outbox, ScriptedAdapter(lambda a: Retry()), retry_base=timedelta(seconds=10))

    async def one_round():
        async with ob.store() as store:
            return await ob.claim_and_run(ob.executor(store))

    put(ob, database_url)
    (outcome,) = asyncio.run(one_round())
    assert outcome.recorded and outcome.state is ActionState.ADMITTED
    with psycopg.connect(database_url) as conn:
        wait = conn.execute(
            "SELECT available_at - now(), write_started_at, lease_until"
            f' FROM "{schema}".agent_action'
        ).fetchone()
    assert timedelta(seconds=4) < wait[0] <= timedelta(seconds=10)
    assert wait[1:] == (None, None)
    assert asyncio.run(one_round()) == []  # not due yet


def test_retry_after_given_by_the_adapter_is_used(make_outbox, database_url, schema):
    ob = build(make_outbox, ScriptedAdapter(lambda a: Retry(after=timedelta(hours=2))))
    put(ob, database_url)

    async def one_round():
        async with ob.store() as store:
            return await ob.claim_and_run(ob.executor(store))

    asyncio.run(one_round())
    with psycopg.connect(database_url) as conn:
        (wait,) = conn.execute(
            f'SELECT available_at - now() FROM "{schema}".agent_action'
        ).fetchone()
    assert timedelta(hours=1, minutes=59) < wait <= timedelta(hours=2)


def test_defer_gives_the_attempt_back(make_outbox, database_url, schema):
    answers = iter([Defer(timedelta(seconds=30)), Defer(timedelta(seconds=30)), Done("ok")])
    ob = build(make_outbox, ScriptedAdapter(lambda a: next(answers)))
    put(ob, database_url, max_attempts=1)
    report = drain(ob)
    assert report.count() == {"defer": 2, "done": 1}
    row = one_row(database_url, schema)
    assert (row["state"], row["attempt"], row["epoch"]) == ("DONE", 1, 3)


def test_an_exception_before_the_fence_is_a_retry(make_outbox, database_url, schema):
    calls = []

    def script(attempt):
        calls.append(attempt.attempt)
        return RuntimeError("provider down") if attempt.attempt == 1 else Done("second")

    adapter = ScriptedAdapter(fence=False)

    async def execute(attempt):
        outcome = script(attempt)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome

    adapter.execute = execute
    ob = build(make_outbox, adapter)
    put(ob, database_url)
    report = drain(ob)
    assert report.count() == {"retry": 1, "done": 1}
    assert one_row(database_url, schema)["state"] == "DONE"


def test_an_exception_after_the_fence_of_an_at_most_once_kind_is_uncertain(
    make_outbox, database_url, schema
):
    ob = build(make_outbox, ScriptedAdapter(lambda a: ConnectionResetError("mid-write")), kind=ONCE)
    put(ob, database_url, kind=ONCE)
    report = drain(ob)
    assert report.count() == {"uncertain": 1}
    row = one_row(database_url, schema)
    assert (row["state"], row["stop_reason"]) == ("UNCERTAIN", StopReason.ADAPTER_ERROR_AFTER_WRITE)


def test_an_exception_after_the_fence_of_a_read_back_kind_is_retried_and_the_retry_reads_back(
    make_outbox, database_url, schema
):
    seen_write_started = []

    def script(attempt):
        seen_write_started.append(attempt.write_started)
        if attempt.attempt == 1:
            return ConnectionResetError("mid-write")
        return Done("found-it")

    ob = build(make_outbox, ScriptedAdapter(script), retry_base=timedelta(milliseconds=10))
    put(ob, database_url)
    report = drain(ob)
    assert report.count() == {"retry": 1, "done": 1}
    assert seen_write_started == [False, True]
    row = one_row(database_url, schema)
    assert (row["state"], row["attempt"], row["readback_ref"]) == ("DONE", 2, "found-it")
    assert row["retry_reason"] == StopReason.ADAPTER_ERROR_AFTER_WRITE


def test_a_result_that_is_not_a_result_counts_as_an_error(make_outbox, database_url, schema):
    ob = build(make_outbox, ScriptedAdapter(lambda a: "done!"), kind=ONCE)
    put(ob, database_url, kind=ONCE)
    drain(ob)
    assert one_row(database_url, schema)["state"] == "UNCERTAIN"


async def claim_one(ob, store):
    claimed_at = time.monotonic()
    (claimed,) = await store.claim({"NOTE": 1, "ONCE": 1}, ob.settings.lease)
    return claimed, claimed_at


async def expire_lease(database_url, schema, action_id):
    async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
        await conn.execute(
            f"UPDATE \"{schema}\".agent_action SET lease_until = now() - interval '1 second'"
            " WHERE id = %s",
            (action_id,),
        )


async def test_a_reclaim_between_claim_and_fence_makes_the_first_attempt_abandon(
    make_outbox, database_url, schema
):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder))
    put(ob, database_url)
    async with ob.store() as store:
        executor = ob.executor(store)
        first, first_at = await claim_one(ob, store)
        await expire_lease(database_url, schema, first.action.id)
        second, second_at = await claim_one(ob, store)
        assert second.action.epoch == first.action.epoch + 1
        stale = await executor.run(first, first_at)
        assert (stale.result, stale.recorded) == (Abandoned(), False)
        fresh = await executor.run(second, second_at)
        assert (fresh.result, fresh.recorded) == (Done(f"ref-{first.action.id}"), True)
    row = one_row(database_url, schema)
    assert (row["state"], row["epoch"], row["attempt"]) == ("DONE", 2, 2)


async def test_a_stale_finish_changes_nothing(make_outbox, database_url, schema):
    ob = build(make_outbox, ScriptedAdapter())
    put(ob, database_url)
    async with ob.store() as store:
        first, _ = await claim_one(ob, store)
        await expire_lease(database_url, schema, first.action.id)
        await claim_one(ob, store)
        before = one_row(database_url, schema)
        a = first.action
        stale = ActionAttempt(a, store, ob.settings.write_margin, time.monotonic() + 60)
        outcome = await ob.executor(store)._finish(stale, Done("late"), None)
        assert outcome.recorded is False and outcome.state is None
        retry = finish_for(Retry(after=timedelta(0)), a, ob.settings)
        defer = finish_for(Defer(timedelta(0)), a, ob.settings)
        assert retry is not None and defer is not None
        assert await store.finish(a.token, retry) is False
        assert await store.finish(a.token, defer) is False
    assert one_row(database_url, schema) == before


async def test_the_fence_refuses_with_less_than_the_margin_left(make_outbox, database_url, schema):
    ob = build(
        make_outbox,
        ScriptedAdapter(),
        lease=timedelta(seconds=30),
        write_margin=timedelta(seconds=2),
    )
    put(ob, database_url)
    async with ob.store() as store:
        claimed, at = await claim_one(ob, store)
        # By the database clock only 1.5 s of the lease is left (this process does not know).
        async with await psycopg.AsyncConnection.connect(database_url, autocommit=True) as conn:
            await conn.execute(
                f"UPDATE \"{schema}\".agent_action SET lease_until = now() + interval '1.5 seconds'"
            )
        outcome = await ob.executor(store).run(claimed, at)
    # The fence refused, so the adapter abandoned and nothing was written: the action waits
    # for its lease to run out.
    assert (outcome.result, outcome.recorded) == (Abandoned(), False)
    row = one_row(database_url, schema)
    assert (row["state"], row["write_started_at"]) == ("EXECUTING", None)


async def test_an_adapter_that_outlives_its_lease_before_the_fence_is_cancelled_and_retried(
    make_outbox, database_url, schema
):
    ob = build(
        make_outbox,
        ScriptedAdapter(delay=30),
        lease=timedelta(seconds=2),
        write_margin=timedelta(seconds=1),
    )
    put(ob, database_url)
    started = time.monotonic()
    async with ob.store() as store:
        claimed, at = await claim_one(ob, store)
        outcome = await ob.executor(store).run(claimed, at)
    assert time.monotonic() - started < 5
    assert outcome.recorded and outcome.state is ActionState.ADMITTED
    assert isinstance(outcome.result, Retry)


class SlowWriter:
    """Passes its fence, then outlives any lease."""

    async def execute(self, attempt):
        assert await attempt.fence().begin_write()
        await asyncio.sleep(30)
        return Done()


async def run_under_lease(make_outbox, database_url, adapter, kind, lease, margin):
    """One attempt of a fresh action of ``kind`` by ``adapter``, under a lease of ``lease``
    seconds with a write margin of ``margin``: its outcome."""
    ob = build(
        make_outbox,
        adapter,
        kind=kind,
        lease=timedelta(seconds=lease),
        write_margin=timedelta(seconds=margin),
    )
    put(ob, database_url, kind=kind)
    async with ob.store() as store:
        claimed, at = await claim_one(ob, store)
        return await ob.executor(store).run(claimed, at)


async def test_an_at_most_once_adapter_that_outlives_its_lease_after_the_fence_ends_uncertain(
    make_outbox, database_url, schema
):
    outcome = await run_under_lease(make_outbox, database_url, SlowWriter(), ONCE, 2, 1)
    assert outcome.result == Uncertain(StopReason.LEASE_EXPIRED_DURING_WRITE)
    assert one_row(database_url, schema)["state"] == "UNCERTAIN"


async def test_a_read_back_adapter_that_outlives_its_lease_after_the_fence_is_retried(
    make_outbox, database_url, schema
):
    outcome = await run_under_lease(make_outbox, database_url, SlowWriter(), NOTE, 2, 1)
    assert outcome.result == Retry(reason=StopReason.LEASE_EXPIRED_DURING_WRITE)
    row = one_row(database_url, schema)
    # Waiting again, with the evidence its next attempt reads back for.
    assert (row["state"], row["attempt"]) == ("ADMITTED", 1)
    assert row["earlier_write_at"] is not None


class WriterOnABusyLoop:
    """Passes its fence, then waits past its lease while something else holds the loop for
    0.2 s from just before the lease's end to just after it. Notes how much of its time was
    left when it was cut."""

    left_when_cut: float | None = None

    async def execute(self, attempt):
        assert await attempt.fence().begin_write()
        loop = asyncio.get_running_loop()
        loop.call_at(loop.time() + attempt.time_left() - 0.15, time.sleep, 0.2)
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            self.left_when_cut = attempt.time_left()
            raise
        return Done()


async def test_a_loop_running_late_still_cuts_an_attempt_past_its_fence_before_its_lease_ends(
    make_outbox, database_url, schema
):
    # The lease's end is when another claimer may take the action again and start the next of
    # its lane: the cut comes a lead before it, so a loop 0.2 s late still stops the attempt.
    writer = WriterOnABusyLoop()
    outcome = await run_under_lease(make_outbox, database_url, writer, ONCE, 2, 1)
    assert outcome.result == Uncertain(StopReason.LEASE_EXPIRED_DURING_WRITE)
    assert writer.left_when_cut is not None and writer.left_when_cut > 0


async def test_at_most_once_lease_lost_after_the_fence_ends_uncertain_and_never_runs_again(
    make_outbox, database_url, schema
):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder), kind=ONCE)
    put(ob, database_url, kind=ONCE)
    async with ob.store() as store:
        claimed, _ = await claim_one(ob, store)
        # The worker passed the fence, then died: no finish is ever written.
        assert await store.begin_write(claimed.action.token, timedelta(0))
        await expire_lease(database_url, schema, claimed.action.id)
    report = await drain_async(ob)
    assert report.attempts == 0 and recorder.calls == {}
    row = one_row(database_url, schema)
    assert (row["state"], row["stop_reason"]) == ("UNCERTAIN", StopReason.LEASE_LOST_AFTER_WRITE)


async def test_a_read_back_adapter_sees_write_started_on_its_next_attempt(
    make_outbox, database_url, schema
):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder))
    put(ob, database_url)
    async with ob.store() as store:
        claimed, _ = await claim_one(ob, store)
        assert claimed.action.write_started_at is None
        assert await store.begin_write(claimed.action.token, timedelta(0))
        await expire_lease(database_url, schema, claimed.action.id)
    report = await drain_async(ob)
    assert report.count() == {"done": 1}
    (attempt,) = recorder.attempts
    assert attempt.write_started and attempt.attempt == 2


async def test_a_lost_lease_at_the_last_attempt_fails_exhausted(make_outbox, database_url, schema):
    ob = build(make_outbox, ScriptedAdapter())
    put(ob, database_url, max_attempts=1)
    async with ob.store() as store:
        claimed, _ = await claim_one(ob, store)
        await expire_lease(database_url, schema, claimed.action.id)
    await drain_async(ob)
    row = one_row(database_url, schema)
    assert (row["state"], row["stop_reason"]) == ("FAILED", StopReason.ATTEMPTS_EXHAUSTED)


async def test_a_lost_lease_after_a_read_back_write_at_the_last_attempt_is_uncertain(
    make_outbox, database_url, schema
):
    ob = build(make_outbox, ScriptedAdapter())
    put(ob, database_url, max_attempts=1)
    async with ob.store() as store:
        claimed, _ = await claim_one(ob, store)
        assert await store.begin_write(claimed.action.token, timedelta(0))
        await expire_lease(database_url, schema, claimed.action.id)
    await drain_async(ob)
    assert one_row(database_url, schema)["state"] == "UNCERTAIN"


async def test_no_adapter_runs_while_the_executor_holds_a_connection(
    make_outbox, database_url, schema
):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder))
    put(ob, database_url)
    async with ob.store() as store:
        claimed, at = await claim_one(ob, store)
        async with store.connection():
            assert held_connections.get() == 1
            with pytest.raises(TransactionOpenError):
                await ob.executor(store).run(claimed, at)
    assert recorder.calls == {}


def test_a_second_adapter_for_a_kind_is_refused(make_outbox):
    ob = make_outbox()
    ob.register(NOTE, ScriptedAdapter())
    with pytest.raises(AdapterAlreadyRegistered):
        ob.register(NOTE, ScriptedAdapter())


async def test_a_claimed_action_without_an_adapter_here_is_given_back(
    make_outbox, database_url, schema
):
    ob = build(make_outbox, ScriptedAdapter())
    other = make_outbox()  # a process that knows the kind but runs no adapter for it
    put(ob, database_url)
    async with other.store() as store:
        claimed, at = await claim_one(ob, store)
        outcome = await other.executor(store).run(claimed, at)
    assert outcome.recorded and outcome.state is ActionState.ADMITTED
    row = one_row(database_url, schema)
    assert (row["state"], row["attempt"]) == ("ADMITTED", 0)


def test_drain_raises_when_it_does_not_settle(make_outbox, database_url):
    ob = build(make_outbox, ScriptedAdapter(lambda a: Defer(timedelta(seconds=1))))
    put(ob, database_url)
    with pytest.raises(DrainDidNotSettle):
        drain(ob, max_rounds=5)


def test_attempts_that_run_out_keep_the_last_retry_reason(make_outbox, database_url, schema):
    ob = build(make_outbox, ScriptedAdapter(lambda attempt: Retry(reason="SMTP_LOGIN_535")))
    [action] = put(ob, database_url, max_attempts=2)
    drain(ob)
    with psycopg.connect(database_url) as conn:
        [row] = rows(conn, schema, f"id = {action.id}")
    assert (row["state"], row["stop_reason"], row["attempt"]) == (
        "FAILED",
        StopReason.ATTEMPTS_EXHAUSTED,
        2,
    )
    assert row["retry_reason"] == "SMTP_LOGIN_535"


def test_a_retry_after_a_write_keeps_its_evidence_for_every_later_attempt(
    make_outbox, database_url, schema
):
    """Attempt 1 writes and gets a 5xx (Retry); attempt 2 fails before its fence (an error in
    its read-back search); attempt 3 must still know that attempt 1 wrote, and read back."""

    class ReadBack:
        def __init__(self) -> None:
            self.seen: list[bool] = []

        async def execute(self, attempt):
            self.seen.append(attempt.write_started)
            if attempt.attempt == 2:
                raise ConnectionError("read-back search failed")
            if not await attempt.fence().begin_write():
                return Abandoned()
            return Retry(reason="HTTP_503") if attempt.attempt == 1 else Done("found")

    adapter = ReadBack()
    ob = build(make_outbox, adapter)
    [action] = put(ob, database_url)
    drain(ob)
    assert adapter.seen == [False, True, True]
    with psycopg.connect(database_url) as conn:
        [row] = rows(conn, schema, f"id = {action.id}")
    assert (row["state"], row["attempt"]) == ("DONE", 3)


class WriterIntoTheMargin:
    """Passes its fence, then takes most of the write margin: the provider's time."""

    async def execute(self, attempt):
        assert await attempt.fence().begin_write()
        await asyncio.sleep(1.2)
        return Done("late-but-in-time")


async def test_an_adapter_past_its_fence_may_use_the_margin_and_still_finish(
    make_outbox, database_url, schema
):
    outcome = await run_under_lease(make_outbox, database_url, WriterIntoTheMargin(), ONCE, 3, 2)
    assert outcome.result == Done("late-but-in-time")
    assert one_row(database_url, schema)["state"] == "DONE"


async def test_an_adapters_own_timeout_before_the_fence_is_its_error_not_the_lease(
    make_outbox, database_url, schema
):
    class OwnTimeout:
        async def execute(self, attempt):
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1)

    ob = build(make_outbox, OwnTimeout())
    put(ob, database_url)
    async with ob.store() as store:
        claimed, at = await claim_one(ob, store)
        outcome = await ob.executor(store).run(claimed, at)
    assert outcome.result == Retry(reason="ERROR:TimeoutError")


async def test_finished_attempts_leave_no_reference_cycles(make_outbox, database_url, schema):
    # An attempt's objects (its task, coroutine, action, payload and outcome) must be freed
    # when it ends, not kept until the garbage collector finds a cycle through them: a busy
    # process would collect every few rounds, and hold every payload until it does.
    class Writer:  # keeps nothing of an attempt (ScriptedAdapter records them)
        async def execute(self, attempt):
            assert await attempt.fence().begin_write()
            return Done()

    n = 50
    ob = build(make_outbox, Writer())
    put(ob, database_url, n=n)
    async with ob.store() as store:
        executor = ob.executor(store)
        claimed_at = time.monotonic()
        claimed = await store.claim({"NOTE": n}, ob.settings.lease)
        assert len(claimed) == n
        gc.collect()
        gc.disable()
        try:
            outcomes = await asyncio.gather(*(executor.run(c, claimed_at) for c in claimed))
            assert all(outcome.recorded for outcome in outcomes)
            del outcomes, claimed
            unreachable = gc.collect()
        finally:
            gc.enable()
    assert unreachable < n, f"{unreachable} objects of {n} attempts were only freed by the GC"
