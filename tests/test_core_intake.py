"""The application's transaction never locks a lane row: enqueues, admits and erasures leave
their lanes to the lane intake, which the outbox's own processes fold in at every claim. So a
caller never waits on, nor deadlocks with, the claimers' and workers' finishes."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, enqueue, enqueue_many
from tests.support import ScriptedAdapter, expected_lanes, lanes

NOTE = ActionKind("NOTE")


def request(lane: str, key: str) -> ActionRequest:
    return ActionRequest(NOTE, lane_key=lane, idempotency_key=key, workspace_id="w")


@pytest.fixture
def ob(make_outbox):
    outbox = make_outbox()
    outbox.register(NOTE, ScriptedAdapter())
    outbox.migrate()
    return outbox


def _executing(ob, database_url, lanes_: list[str]) -> dict[str, tuple[int, int]]:
    """One claimed (EXECUTING) action in each lane: lane -> (id, epoch)."""
    with psycopg.connect(database_url) as conn:
        for lane in lanes_:
            enqueue(conn, request(lane, f"exec-{lane}"), schema=ob.schema)

    async def claim():
        async with ob.store() as store:
            return await store.claim({NOTE.name: len(lanes_)}, ob.settings.lease, take=False)

    claimed = asyncio.run(claim())
    assert len(claimed) == len(lanes_)
    return {c.action.lane_key: (c.action.id, c.action.epoch) for c in claimed}


def _finish_sql(schema: str) -> str:
    return (
        f"UPDATE \"{schema}\".agent_action SET state = 'DONE', stop_reason = 'DONE',"
        " payload = NULL, ended_at = now() WHERE id = %s AND epoch = %s"
    )


def test_an_open_enqueue_transaction_never_holds_up_a_finish_of_its_lane(ob, database_url):
    held = _executing(ob, database_url, ["A"])
    with psycopg.connect(database_url) as caller, psycopg.connect(database_url) as worker:
        enqueue(caller, request("A", "next-A"), schema=ob.schema)
        enqueue(caller, request("B", "next-B"), schema=ob.schema)
        # The caller's transaction stays open; the worker's finish of lane A must not wait.
        worker.execute("SET lock_timeout = '2s'")
        worker.execute(_finish_sql(ob.schema), held["A"])
        worker.commit()
        caller.commit()
        assert lanes(caller, ob.schema) == expected_lanes(caller, ob.schema)


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_caller_over_many_lanes_never_deadlocks_with_a_finishing_batch(ob, database_url, many):
    """The cycle that used to cost the caller its transaction: the caller holds lane L1 and
    wants L2, while a finishing batch holds L2 and wants L1."""
    held = _executing(ob, database_url, ["L1", "L2"])
    errors: list[BaseException] = []
    with psycopg.connect(database_url) as caller, psycopg.connect(database_url) as worker:
        worker.execute("SET deadlock_timeout = '100ms'")
        enqueue(caller, request("L1", "n-L1"), schema=ob.schema)
        worker.execute(_finish_sql(ob.schema), held["L2"])

        def finish_l1() -> None:
            try:
                worker.execute(_finish_sql(ob.schema), held["L1"])
                worker.commit()
            except BaseException as error:  # recorded, asserted below
                errors.append(error)
                worker.rollback()

        finishing = threading.Thread(target=finish_l1)
        finishing.start()
        finishing.join(timeout=1.0)
        more = [request("L2", "n-L2"), *(request(f"X{i}", f"n-X{i}") for i in range(50))]
        if many:
            enqueue_many(caller, more, schema=ob.schema)
        else:
            for item in more:
                enqueue(caller, item, schema=ob.schema)
        caller.commit()
        finishing.join(timeout=10)
        assert not finishing.is_alive()
    assert errors == []
    with psycopg.connect(database_url) as conn:
        states = dict(
            conn.execute(
                f'SELECT idempotency_key, state FROM "{ob.schema}".agent_action'
                " WHERE idempotency_key LIKE 'exec-%%' OR idempotency_key LIKE 'n-L%%'"
            ).fetchall()
        )
        assert states == {
            "exec-L1": "DONE",
            "exec-L2": "DONE",
            "n-L1": "ADMITTED",
            "n-L2": "ADMITTED",
        }
        assert lanes(conn, ob.schema) == expected_lanes(conn, ob.schema)


def test_a_lane_whose_row_a_finish_holds_is_folded_by_the_next_claim(ob, database_url):
    held = _executing(ob, database_url, ["A"])
    with psycopg.connect(database_url) as worker, psycopg.connect(database_url) as conn:
        worker.execute(_finish_sql(ob.schema), held["A"])  # holds lane A's row, uncommitted
        enqueue(conn, request("A", "after-A"), schema=ob.schema)
        conn.commit()
        # The intake skips the held lane and keeps its intake row: nothing is lost.
        conn.execute(f'SELECT "{ob.schema}".agent_action_lane_intake(100)')
        conn.commit()
        pending = conn.execute(
            f'SELECT count(*) FROM "{ob.schema}".agent_action_lane_intake'
        ).fetchone()
        assert pending == (1,)
        worker.commit()
        assert lanes(conn, ob.schema) == expected_lanes(conn, ob.schema)

    async def claim():
        async with ob.store() as store:
            return await store.claim({NOTE.name: 10}, timedelta(minutes=1))

    [claimed] = asyncio.run(claim())
    assert claimed.action.idempotency_key == "after-A"


def test_a_head_committed_after_a_later_one_was_folded_still_runs_first(ob, database_url):
    """Two transactions enqueue into one lane; the one with the smaller id commits last. A
    claim never takes the later action while the earlier one waits, folded or not."""
    with psycopg.connect(database_url) as early, psycopg.connect(database_url) as late:
        first = enqueue(early, request("L", "first"), schema=ob.schema)
        second = enqueue(late, request("L", "second"), schema=ob.schema)
        late.commit()
        late.execute(f'SELECT "{ob.schema}".agent_action_lane_intake(100)')
        late.commit()
        early.commit()  # its intake row is not folded yet
    assert first.id < second.id
    with psycopg.connect(database_url) as conn:
        conn.execute(  # hide the intake from the claim: only the NOT EXISTS guard is left
            f'DELETE FROM "{ob.schema}".agent_action_lane_intake'
        )
        conn.commit()

    async def claim():
        async with ob.store() as store:
            return await store.claim({NOTE.name: 10}, timedelta(minutes=1))

    assert [c.action.id for c in asyncio.run(claim())] == []
