"""The lane hand-off: an end claims and takes its lane's next action in the same statement, for
the worker that ended it to run, only when the claimer would have claimed it for a worker of the
same kind and limit key; one executing action replaces another, so nothing a claimer bounds
ever rises, and whatever is not handed on waits at its lane's head for the claimer."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from outbox import ActionKind, ActionRequest, Done, Retry, enqueue_many
from outbox.dispatch.runtime import HAND_OFF_SLACK, WorkerRuntime
from outbox.operator.pausing import pause
from outbox.results import finish_for
from outbox.store import ClaimedAction, Finished

NOTE = ActionKind("NOTE")
OTHER = ActionKind("OTHER")
HAND_OFF = timedelta(seconds=30)


def _request(i: int, lane: str = "L", kind: ActionKind = NOTE, **fields: Any) -> ActionRequest:
    defaults: dict[str, Any] = {"workspace_id": "w", "payload": {"i": i}}
    return ActionRequest(
        kind=kind, lane_key=lane, idempotency_key=f"k{i}", **{**defaults, **fields}
    )


def _outbox(make_outbox):
    ob = make_outbox()
    ob.declare(NOTE)
    ob.declare(OTHER)
    ob.migrate()
    return ob


def _row(database_url: str, schema: str, action_id: int) -> dict[str, Any]:
    with psycopg.connect(database_url, row_factory=dict_row) as c:
        row = c.execute(f'SELECT * FROM "{schema}".agent_action WHERE id = %s', (action_id,))
        found = row.fetchone()
        assert found is not None
        return found


def _lane(database_url: str, schema: str, lane: str) -> dict | None:
    with psycopg.connect(database_url, row_factory=dict_row) as c:
        return c.execute(
            f'SELECT * FROM "{schema}".agent_action_lane WHERE lane_key = %s', (lane,)
        ).fetchone()


def _two_in_lane(make_outbox, conn, schema: str):
    """The outbox, and two actions of lane L."""
    ob = _outbox(make_outbox)
    first, second = enqueue_many(conn, [_request(0), _request(1)], schema=schema)
    conn.commit()
    return ob, first, second


async def _head(ob, store) -> ClaimedAction:
    """The one due lane head, claimed and taken in process."""
    (claimed,) = await store.claim({"NOTE": 10}, ob.settings.lease)
    return claimed


async def _end(ob, store, claimed: ClaimedAction, result=None) -> Finished | None:
    finish = finish_for(result or Done(), claimed.action, ob.settings)
    assert finish is not None
    return await store.finish_and_hand_off(
        claimed.action.token, finish, None, fenced=False, lease=HAND_OFF
    )


def test_an_end_hands_its_lane_on_to_the_next_action_until_the_lane_is_empty(
    make_outbox, database_url, schema, conn
):
    ob = _outbox(make_outbox)
    ids = [a.id for a in enqueue_many(conn, [_request(i) for i in range(3)], schema=schema)]
    conn.commit()

    async def go() -> list[ClaimedAction]:
        async with ob.store() as store:
            (first,) = await store.claim({"NOTE": 10}, ob.settings.lease)
            chain = [first]
            while True:
                finished = await _end(ob, store, chain[-1])
                assert finished is not None
                if finished.next is None:
                    return chain
                if len(chain) == 2:  # mid-chain: the last action executes, nothing waits
                    assert _lane(database_url, schema, "L") is None
                    assert _row(database_url, schema, ids[2])["state"] == "EXECUTING"
                chain.append(finished.next)

    chain = asyncio.run(go())
    assert [c.action.id for c in chain] == ids
    second = chain[1]
    # Claimed and taken at once, as a worker's take leaves it, with its payload and the lease
    # the caller gave.
    assert second.action.payload == {"i": 1}
    assert (second.action.epoch, second.action.attempt) == (1, 1)
    assert timedelta(seconds=25) < second.lease_left <= HAND_OFF
    for action_id in ids:
        row = _row(database_url, schema, action_id)
        assert (row["state"], row["epoch"], row["attempt"], row["taken_epoch"]) == (
            "DONE",
            1,
            1,
            1,
        )
    with psycopg.connect(database_url) as c:
        history = c.execute(
            f'SELECT action_id, epoch, attempt, result FROM "{schema}".agent_action_attempt'
            " ORDER BY action_id"
        ).fetchall()
    assert history == [(i, 1, 1, "DONE") for i in ids]
    assert _lane(database_url, schema, "L") is None  # the empty lane's row is dropped


def _later(ob, conn, schema: str) -> None:
    """The successor is not due yet."""
    enqueue_many(
        conn,
        [_request(1, not_before=datetime.now(UTC) + timedelta(hours=1))],
        schema=schema,
    )


def _expired(ob, conn, schema: str) -> None:
    enqueue_many(
        conn,
        [_request(1, expires_at=datetime.now(UTC) + timedelta(seconds=1))],
        schema=schema,
    )
    conn.commit()
    time.sleep(1.1)


def _paused(ob, conn, schema: str) -> None:
    enqueue_many(conn, [_request(1)], schema=schema)
    conn.commit()
    pause(conn, "NOTE", actor="test", schema=schema)


def _held(ob, conn, schema: str) -> None:
    """Its kind's provider is down and its outage holds the kind (``outbox.provider_outage``)."""
    enqueue_many(conn, [_request(1)], schema=schema)
    conn.execute(
        f'INSERT INTO "{schema}".agent_action_kind_outage (kind, since, retried, held_until,'
        " holds) VALUES ('NOTE', now(), '{7, 8}', now() + interval '1 hour', 1)"
    )


SUCCESSORS = {
    "of another kind": lambda ob, conn, schema: enqueue_many(
        conn, [_request(1, kind=OTHER)], schema=schema
    ),
    "of another limit key": lambda ob, conn, schema: enqueue_many(
        conn, [_request(1, workspace_id="other")], schema=schema
    ),
    "a proposal": lambda ob, conn, schema: enqueue_many(
        conn, [_request(1, proposal=True)], schema=schema
    ),
    "not due yet": _later,
    "expired": _expired,
    "of a paused kind": _paused,
    "of a kind its provider's outage holds": _held,
}


@pytest.mark.parametrize("successor", sorted(SUCCESSORS))
def test_a_successor_the_claimer_would_not_give_this_worker_is_not_handed_on(
    make_outbox, database_url, schema, conn, successor
):
    """A successor of another kind or limit key (another worker pool, another key's cap), not
    admitted, not due, expired, paused or held by its provider's outage stays where the claimer
    finds it (or, paused or held, leaves it): the end is written, nothing else moves."""
    ob = _outbox(make_outbox)
    (first,) = enqueue_many(conn, [_request(0)], schema=schema)
    conn.commit()

    async def claim() -> ClaimedAction:
        async with ob.store() as store:
            (claimed,) = await store.claim({"NOTE": 10}, ob.settings.lease)
            return claimed

    claimed = asyncio.run(claim())
    SUCCESSORS[successor](ob, conn, schema)
    conn.commit()

    async def end() -> Finished | None:
        async with ob.store() as store:
            return await _end(ob, store, claimed)

    finished = asyncio.run(end())
    assert finished is not None and finished.next is None
    assert _row(database_url, schema, first.id)["state"] == "DONE"
    with psycopg.connect(database_url) as c:
        (waiting,) = c.execute(
            f'SELECT state, epoch, attempt FROM "{schema}".agent_action WHERE id > %s',
            (first.id,),
        ).fetchall()
    assert waiting[1:] == (0, 0) and waiting[0] in ("ADMITTED", "PROPOSED", "EXPIRED")


def test_a_retry_hands_nothing_on_its_action_waits_at_the_head_again(
    make_outbox, database_url, schema, conn
):
    ob, first, second = _two_in_lane(make_outbox, conn, schema)

    async def go() -> Finished | None:
        async with ob.store() as store:
            return await _end(ob, store, await _head(ob, store), Retry(after=timedelta(0)))

    finished = asyncio.run(go())
    assert finished is not None and finished.next is None
    assert _row(database_url, schema, first.id)["state"] == "ADMITTED"
    assert _row(database_url, schema, second.id)["epoch"] == 0
    lane = _lane(database_url, schema, "L")
    assert lane is not None and lane["head_id"] == first.id


def test_a_successor_another_transaction_holds_is_left_and_the_end_still_written(
    make_outbox, database_url, schema, conn
):
    """An operator's or an erasure's transaction holding the next action: the end does not
    wait for it, and the claimer finds the action later."""
    ob, first, second = _two_in_lane(make_outbox, conn, schema)

    async def go() -> Finished | None:
        async with ob.store() as store:
            claimed = await _head(ob, store)
            with psycopg.connect(database_url) as holder:
                holder.execute(
                    f'SELECT 1 FROM "{schema}".agent_action WHERE id = %s FOR UPDATE',
                    (second.id,),
                )
                return await asyncio.wait_for(_end(ob, store, claimed), 10)

    finished = asyncio.run(go())
    assert finished is not None and finished.next is None
    assert _row(database_url, schema, first.id)["state"] == "DONE"
    assert _row(database_url, schema, second.id)["state"] == "ADMITTED"


def test_a_stale_end_hands_nothing_on(make_outbox, database_url, schema, conn):
    ob, first, second = _two_in_lane(make_outbox, conn, schema)

    async def go() -> Finished | None:
        async with ob.store() as store:
            claimed = await _head(ob, store)
            with psycopg.connect(database_url) as c:  # a reclaim moved the epoch on
                c.execute(
                    f'UPDATE "{schema}".agent_action SET epoch = epoch + 1 WHERE id = %s',
                    (first.id,),
                )
            return await _end(ob, store, claimed)

    assert asyncio.run(go()) is None
    assert _row(database_url, schema, first.id)["state"] == "EXECUTING"
    assert _row(database_url, schema, second.id)["epoch"] == 0


def test_group_committed_ends_hand_on_every_lane_and_the_kinds_executing_count_holds(
    make_outbox, database_url, schema, conn
):
    """Forty concurrent ends (one or two statements) hand on forty lanes: each lane's next
    action, and the kind and key never have more executing actions than before."""
    ob = _outbox(make_outbox)
    lanes = 40
    requests = [_request(i * lanes + n, lane=f"L{n}") for i in range(3) for n in range(lanes)]
    ids = [a.id for a in enqueue_many(conn, requests, schema=schema)]
    conn.commit()

    def executing() -> int:
        with psycopg.connect(database_url) as c:
            row = c.execute(
                f"SELECT count(*) FROM \"{schema}\".agent_action WHERE state = 'EXECUTING'"
            ).fetchone()
            assert row is not None
            return int(row[0])

    async def go() -> list[Finished | None]:
        async with ob.store() as store:
            claimed = await store.claim({"NOTE": lanes}, ob.settings.lease)
            assert len(claimed) == lanes and executing() == lanes
            return await asyncio.gather(*(_end(ob, store, c) for c in claimed))

    finished = asyncio.run(go())
    handed = sorted(f.next.action.id for f in finished if f is not None and f.next is not None)
    assert handed == ids[lanes : 2 * lanes]
    assert executing() == lanes


def test_a_worker_hands_on_at_most_its_budget_and_never_past_the_message_time_limit(
    make_outbox,
):
    ob = make_outbox(lease=timedelta(seconds=20), write_margin=timedelta(seconds=2), hand_off=3)
    runtime = WorkerRuntime(ob)
    now = time.monotonic()
    lease = runtime.hand_off(now, 0)
    assert lease is not None
    assert timedelta(seconds=20 - HAND_OFF_SLACK - 1) < lease <= timedelta(seconds=20)
    assert runtime.hand_off(now, 2) is not None
    assert runtime.hand_off(now, 3) is None  # the budget
    # Half the message's time limit gone: the next one's lease would be less than half a lease.
    assert runtime.hand_off(now - 10, 0) is None
    assert WorkerRuntime(make_outbox(hand_off=0)).hand_off(now, 0) is None
    # A worker that began to stop waits for its messages: they hand nothing on.
    runtime.stop_handing_off()
    assert runtime.hand_off(time.monotonic(), 0) is None


class _Recording:
    """An adapter that records the ids it ran and ends each DONE."""

    def __init__(self) -> None:
        self.ran: list[int] = []

    async def execute(self, attempt) -> Done:
        self.ran.append(attempt.id)
        return Done()


def test_the_executor_runs_its_end_s_successor_next_and_counts_the_hand_off(
    make_outbox, database_url, schema, conn
):
    from outbox.metrics import HANDED_ON

    adapter = _Recording()
    ob = make_outbox()
    ob.register(NOTE, adapter)
    ob.migrate()
    ids = [a.id for a in enqueue_many(conn, [_request(i) for i in range(3)], schema=schema)]
    conn.commit()
    before = HANDED_ON.labels(kind="NOTE")._value.get()

    async def go() -> None:
        async with ob.store() as store:
            executor = ob.executor(store)
            claimed_at = time.monotonic()
            (claimed,) = await store.claim({"NOTE": 10}, ob.settings.lease)
            outcome = await executor.run(claimed, claimed_at, hand_off=HAND_OFF)
            while outcome.next is not None:
                assert outcome.next_claimed_at >= claimed_at
                outcome = await executor.run(
                    outcome.next, outcome.next_claimed_at, hand_off=HAND_OFF
                )
            # Without a hand-off lease the executor ends and hands nothing on.
            assert outcome.next is None

    asyncio.run(go())
    assert adapter.ran == ids
    assert HANDED_ON.labels(kind="NOTE")._value.get() - before == 2


class _Deadlines:
    """An adapter that records each attempt's local deadline (monotonic) and ends it DONE."""

    def __init__(self) -> None:
        self.deadlines: dict[int, float] = {}

    async def execute(self, attempt) -> Done:
        self.deadlines[attempt.id] = attempt.deadline
        return Done()


@pytest.mark.parametrize("late", ["busy loop", "thread kept waiting after the delivery"])
def test_a_message_s_time_runs_from_its_delivery_not_from_when_it_got_to_run(
    make_outbox, database_url, schema, conn, late
):
    """The fabric's time limit (the lease) runs from the moment it began the message. A worker
    loop busy at that moment, or the fabric's thread kept waiting between its middleware and
    the actor, starts the message late; the attempt's deadline and the hand-off's lease still
    count from the delivery, so the time limit never cancels an attempt whose own lease holds
    (past its fence, an email would end UNCERTAIN)."""
    from outbox._io import run_sync
    from outbox.dispatch.runtime import mark_delivery
    from outbox.store import claim_operation

    adapter = _Deadlines()
    lease = timedelta(seconds=4)
    ob = make_outbox(lease=lease, write_margin=timedelta(milliseconds=500), hand_off=3)
    ob.register(NOTE, adapter)
    ob.migrate()
    first, second = enqueue_many(conn, [_request(0), _request(1)], schema=schema)
    conn.commit()
    (claimed,) = run_sync(conn, claim_operation(schema, {"NOTE": 1}, lease, take=False))
    conn.commit()
    assert claimed.action.id == first.id
    runtime = WorkerRuntime(ob)
    runtime.start()
    busy = 1.5
    try:
        runtime.wait_ready(timeout=30)
        assert runtime._thread is not None
        delivered = time.monotonic()
        if late == "busy loop":
            runtime._thread.loop.call_soon_threadsafe(time.sleep, busy)
        else:
            mark_delivery()  # as DeliveryClock does, before Dramatiq's TimeLimit
            time.sleep(busy)
        (outcome,) = runtime.run_many("NOTE", [claimed.action.token])
    finally:
        runtime.stop()
    assert outcome is not None and outcome.recorded
    assert adapter.deadlines[first.id] <= delivered + lease.total_seconds() + 0.2
    # The late start and the hand-off's slack left less than half a lease: nothing handed on.
    assert lease.total_seconds() - busy - HAND_OFF_SLACK < lease.total_seconds() / 2
    assert _row(database_url, schema, second.id)["state"] == "ADMITTED"
    assert second.id not in adapter.deadlines


def test_a_message_that_waited_past_its_time_for_the_pool_is_not_taken(
    make_outbox, database_url, schema, conn
):
    """A message whose fabric clock (the lease, from its delivery) leaves less than the write
    margin by the time the worker's pool is ready could never pass its fence: it is left to its
    claim's lease, untaken, instead of spending an attempt on an immediate retry."""
    from outbox._io import run_sync
    from outbox.dispatch.runtime import mark_delivery
    from outbox.store import claim_operation

    adapter = _Deadlines()
    lease, margin = timedelta(seconds=2), timedelta(milliseconds=500)
    ob = make_outbox(lease=lease, write_margin=margin)
    ob.register(NOTE, adapter)
    ob.migrate()
    enqueue_many(conn, [_request(0, "A"), _request(1, "B")], schema=schema)
    conn.commit()
    late, timely = run_sync(conn, claim_operation(schema, {"NOTE": 2}, lease, take=False))
    conn.commit()
    runtime = WorkerRuntime(ob)
    runtime.start()
    try:
        mark_delivery()  # as DeliveryClock does; then the pool keeps it waiting past its time
        time.sleep((lease - margin).total_seconds() + 0.1)
        assert runtime.run("NOTE", late.action.token) is None
        mark_delivery()
        outcome = runtime.run("NOTE", timely.action.token)
    finally:
        runtime.stop()
    untaken = _row(database_url, schema, late.action.id)
    assert (untaken["state"], untaken["attempt"], untaken["taken_epoch"]) == ("EXECUTING", 0, None)
    assert late.action.id not in adapter.deadlines
    assert outcome is not None and outcome.recorded
    assert _row(database_url, schema, timely.action.id)["state"] == "DONE"


def test_the_delivery_clock_starts_before_dramatiq_s_time_limit_does():
    from dramatiq.brokers.stub import StubBroker
    from dramatiq.middleware import TimeLimit

    from outbox.dispatch.actors import DeliveryClock, _add_delivery_clock

    broker = StubBroker()
    _add_delivery_clock(broker)
    _add_delivery_clock(broker)  # once only
    kinds = [type(m) for m in broker.middleware]
    assert kinds.count(DeliveryClock) == 1
    assert kinds.index(DeliveryClock) < kinds.index(TimeLimit)
    bare = StubBroker(middleware=[])
    _add_delivery_clock(bare)
    assert [type(m) for m in bare.middleware] == [DeliveryClock]
