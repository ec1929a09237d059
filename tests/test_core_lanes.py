"""Lanes: one executing action a lane, in id order, under concurrent claimers; expiry; proposals;
and the lane rows always equal what agent_action says (checked by hypothesis)."""

from __future__ import annotations

import asyncio
import threading
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import ActionKind, ActionRequest, Done, Retry, StopReason, admit, enqueue, refuse
from outbox.results import Finish
from outbox.testing import drain
from tests.support import Recorder, ScriptedAdapter, expected_lanes, lanes, rows

NOTE = ActionKind("NOTE")


def build(make_outbox, adapter, **settings):
    ob = make_outbox(**settings)
    ob.register(NOTE, adapter)
    ob.migrate()
    return ob


def request(lane: str, key: str, **fields) -> ActionRequest:
    return ActionRequest(NOTE, lane_key=lane, idempotency_key=key, workspace_id="w", **fields)


def test_actions_of_a_lane_run_in_id_order_and_never_overlap(make_outbox, conn, schema):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(delay=0.01, recorder=recorder))
    ids = {"A": [], "B": []}
    for i in range(5):
        for lane in ("A", "B"):
            ids[lane].append(enqueue(conn, request(lane, f"{lane}{i}"), schema=schema).id)
    conn.commit()
    drain(ob)
    assert recorder.order == ids
    assert recorder.overlaps == []


def test_a_retried_head_holds_its_lane_until_it_ends(make_outbox, conn, schema):
    recorder = Recorder()
    tries = {"n": 0}

    def script(attempt):
        if attempt.payload["head"] and tries["n"] < 2:
            tries["n"] += 1
            return Retry()
        return Done()

    ob = build(make_outbox, ScriptedAdapter(script, recorder=recorder))
    head = enqueue(conn, request("L", "head", payload={"head": True}), schema=schema)
    tail = enqueue(conn, request("L", "tail", payload={"head": False}), schema=schema)
    conn.commit()
    drain(ob)
    assert recorder.order["L"] == [head.id, head.id, head.id, tail.id]


def test_a_proposal_blocks_its_lane_until_admitted(make_outbox, conn, schema):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder))
    proposal = enqueue(conn, request("L", "p", proposal=True), schema=schema)
    later = enqueue(conn, request("L", "later"), schema=schema)
    conn.commit()
    assert drain(ob).attempts == 0
    admit(conn, proposal.id, schema=schema)
    conn.commit()
    drain(ob)
    assert recorder.order["L"] == [proposal.id, later.id]


def test_a_refused_proposal_frees_its_lane(make_outbox, conn, schema):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder))
    proposal = enqueue(conn, request("L", "p", proposal=True), schema=schema)
    later = enqueue(conn, request("L", "later"), schema=schema)
    refuse(conn, proposal.id, schema=schema)
    conn.commit()
    drain(ob)
    assert recorder.order["L"] == [later.id]
    states = [(r["state"], r["stop_reason"]) for r in rows(conn, schema)]
    assert states == [("CANCELLED", StopReason.REFUSED), ("DONE", "DONE")]


def test_waiting_actions_past_expiry_end_cancelled_expired(make_outbox, conn, schema):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder))
    soon = datetime.now(UTC) + timedelta(minutes=5)
    enqueue(conn, request("A", "admitted", expires_at=soon), schema=schema)
    enqueue(conn, request("B", "proposed", expires_at=soon, proposal=True), schema=schema)
    enqueue(conn, request("C", "no-expiry"), schema=schema)
    conn.execute(
        f"UPDATE \"{schema}\".agent_action SET expires_at = now() - interval '1 second'"
        " WHERE expires_at IS NOT NULL"
    )
    conn.commit()
    drain(ob)
    assert [(r["idempotency_key"], r["state"], r["stop_reason"]) for r in rows(conn, schema)] == [
        ("admitted", "CANCELLED", StopReason.EXPIRED),
        ("proposed", "CANCELLED", StopReason.EXPIRED),
        ("no-expiry", "DONE", "DONE"),
    ]
    assert len(recorder.attempts) == 1


@pytest.mark.slow
def test_four_threads_claiming_ten_thousand_actions_run_each_once_in_lane_order(
    make_outbox, database_url, schema
):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder), batch_size=50)
    expected: dict[str, list[int]] = {}
    with psycopg.connect(database_url) as conn:
        for i in range(10_000):
            lane = f"lane-{i % 100}"
            action = enqueue(conn, request(lane, f"k{i}"), schema=schema)
            expected.setdefault(lane, []).append(action.id)
        conn.commit()

    errors: list[BaseException] = []

    async def claimer() -> None:
        async with ob.store() as store:
            executor = ob.executor(store)
            idle = 0
            while idle < 3:
                outcomes = await ob.claim_and_run(executor)
                idle = 0 if outcomes else idle + 1
                if not outcomes:
                    await asyncio.sleep(0.05)

    def thread() -> None:
        try:
            asyncio.run(claimer())
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=thread) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert recorder.overlaps == []
    assert set(recorder.calls.values()) == {1} and len(recorder.calls) == 10_000
    assert dict(recorder.order) == expected
    with psycopg.connect(database_url) as conn:
        done = conn.execute(
            f"SELECT count(*) FROM \"{schema}\".agent_action WHERE state = 'DONE'"
        ).fetchone()
        assert done == (10_000,)
        assert lanes(conn, schema) == []


# -- the lane rows are a pure function of agent_action -------------------------------------------

OPERATIONS = st.lists(
    st.tuples(
        st.sampled_from(
            [
                "enqueue",
                "propose",
                # Scheduled for an hour from now: its lane waits outside the claims' index.
                "schedule",
                # Every waiting action of the lane due now (as outbox.testing.make_due does).
                "due-now",
                "admit",
                "claim",
                "done",
                "retry",
                "erase",
                "expire",
                # One statement over every lane, as claim_heads and finish_many are: each lane's
                # refresh must see what the statement did to the other rows.
                "claim-every-lane",
                "end-every-lane",
            ]
        ),
        st.integers(min_value=0, max_value=3),  # which lane
    ),
    min_size=1,
    max_size=30,
)


@pytest.fixture
def lane_db(make_outbox, database_url, schema):
    build(make_outbox, ScriptedAdapter())
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        yield conn


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(operations=OPERATIONS)
def test_lane_rows_always_equal_what_the_actions_say(lane_db, schema, operations):
    conn = lane_db
    conn.execute("DELETE FROM agent_action")
    for n, (op, lane_no) in enumerate(operations):
        lane = f"L{lane_no}"
        if op in ("enqueue", "propose", "schedule"):
            later = (
                {"not_before": datetime.now(UTC) + timedelta(hours=1)} if op == "schedule" else {}
            )
            enqueue(
                conn,
                request(lane, f"h{n}-{lane}-{id(operations)}", proposal=op == "propose", **later),
                schema=schema,
            )
        elif op == "due-now":
            conn.execute(
                "UPDATE agent_action SET available_at = now()"
                " WHERE lane_key = %s AND state = 'ADMITTED'",
                (lane,),
            )
        elif op == "admit":
            conn.execute(
                "UPDATE agent_action SET state = 'ADMITTED' WHERE id = (SELECT min(id) FROM"
                " agent_action WHERE lane_key = %s AND state = 'PROPOSED')",
                (lane,),
            )
        elif op == "claim":
            conn.execute(
                "UPDATE agent_action a SET state = 'EXECUTING', epoch = epoch + 1,"
                " lease_until = now() + interval '1 minute'"
                " FROM agent_action_lane l WHERE l.lane_key = %s AND a.id = l.head_id"
                " AND l.executing_id IS NULL AND a.state = 'ADMITTED'",
                (lane,),
            )
        elif op in ("done", "retry"):
            change = (
                "state = 'DONE', stop_reason = 'DONE', payload = NULL, ended_at = now()"
                if op == "done"
                else "state = 'ADMITTED', lease_until = NULL, available_at = now() + interval '1s'"
            )
            conn.execute(
                f"UPDATE agent_action SET {change} WHERE lane_key = %s AND state = 'EXECUTING'",
                (lane,),
            )
        elif op == "erase":
            conn.execute(
                "DELETE FROM agent_action WHERE id = (SELECT min(id) FROM agent_action"
                " WHERE lane_key = %s AND state IN ('PROPOSED', 'ADMITTED', 'EXECUTING'))",
                (lane,),
            )
        elif op == "claim-every-lane":
            conn.execute(
                "UPDATE agent_action a SET state = 'EXECUTING', epoch = epoch + 1,"
                " lease_until = now() + interval '1 minute'"
                " FROM agent_action_lane l WHERE a.id = l.head_id"
                " AND l.executing_id IS NULL AND a.state = 'ADMITTED'"
            )
        elif op == "end-every-lane":
            # Some lanes' actions end, the others' are retried, in one statement.
            conn.execute(
                "UPDATE agent_action SET"
                " state = CASE WHEN mod(id, 2) = 0 THEN 'DONE' ELSE 'ADMITTED' END,"
                " stop_reason = CASE WHEN mod(id, 2) = 0 THEN 'DONE' END,"
                " payload = CASE WHEN mod(id, 2) = 0 THEN NULL ELSE payload END,"
                " ended_at = CASE WHEN mod(id, 2) = 0 THEN now() END,"
                " lease_until = CASE WHEN mod(id, 2) = 0 THEN lease_until END,"
                " available_at = CASE WHEN mod(id, 2) = 0 THEN available_at ELSE now() END"
                " WHERE state = 'EXECUTING'"
            )
        elif op == "expire":
            conn.execute(
                "UPDATE agent_action SET state = 'CANCELLED', stop_reason = 'EXPIRED',"
                " payload = NULL, ended_at = now() WHERE id = (SELECT max(id) FROM agent_action"
                " WHERE lane_key = %s AND state IN ('PROPOSED', 'ADMITTED'))",
                (lane,),
            )
        assert lanes(conn, schema) == expected_lanes(conn, schema), (n, op, lane)


async def test_an_erased_write_holds_its_lane_until_its_lease_ends(
    make_outbox, database_url, schema
):
    from outbox import erase_subject

    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder), lease=timedelta(minutes=5))
    with psycopg.connect(database_url) as conn:
        enqueue(conn, request("L", "erased", subject_account_id="acct"), schema=schema)
        nxt = enqueue(conn, request("L", "next"), schema=schema)
        conn.commit()
    async with ob.store() as store:
        (claimed,) = await store.claim({"NOTE": 10}, ob.settings.lease)
        assert await store.begin_write(claimed.action.token, timedelta(0))
        with psycopg.connect(database_url) as conn:
            erase_subject(conn, "acct", schema=schema)
            conn.commit()
        # The erased attempt may still be writing: its lane's next action waits.
        assert await store.claim({"NOTE": 10}, ob.settings.lease) == []
        with psycopg.connect(database_url) as conn:
            conn.execute(
                f"UPDATE \"{schema}\".agent_action_lane SET busy_until = now() - interval '1s'"
            )
            conn.commit()
        (after,) = await store.claim({"NOTE": 10}, ob.settings.lease)
    assert after.action.id == nxt.id


async def test_an_erased_action_before_its_fence_frees_its_lane_at_once(
    make_outbox, database_url, schema
):
    from outbox import erase_subject

    ob = build(make_outbox, ScriptedAdapter())
    with psycopg.connect(database_url) as conn:
        enqueue(conn, request("L", "erased", subject_account_id="acct"), schema=schema)
        nxt = enqueue(conn, request("L", "next"), schema=schema)
        conn.commit()
    async with ob.store() as store:
        await store.claim({"NOTE": 10}, ob.settings.lease)
        with psycopg.connect(database_url) as conn:
            erase_subject(conn, "acct", schema=schema)
            conn.commit()
        (after,) = await store.claim({"NOTE": 10}, ob.settings.lease)
    assert after.action.id == nxt.id


def _notified(listener: psycopg.Connection) -> int:
    """How many NOTIFYs reached ``listener`` since the last look."""
    return sum(1 for _ in listener.notifies(timeout=0.2, stop_after=100))


async def test_an_ended_action_wakes_the_claimers_only_when_its_lane_has_a_due_successor(
    make_outbox, database_url, schema
):
    """The lane refresh NOTIFYs (migration 0004), so a lane's next action is claimed at once,
    not at the claimer's next poll; an end that leaves nothing due stays silent."""
    from outbox import ActionState

    ob = build(make_outbox, ScriptedAdapter())
    with psycopg.connect(database_url) as conn:
        enqueue(conn, request("L", "first"), schema=schema)
        enqueue(conn, request("L", "second"), schema=schema)
        enqueue(conn, request("alone", "alone"), schema=schema)
        enqueue(conn, request("R", "retried"), schema=schema)
        enqueue(conn, request("R", "behind"), schema=schema)
        enqueue(conn, request("S", "solo"), schema=schema)
        conn.commit()
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f'LISTEN "outbox_{schema}"')
        async with ob.store() as store:
            claimed = {
                c.action.lane_key: c.action
                for c in await store.claim({"NOTE": 10}, ob.settings.lease)
            }
            assert sorted(claimed) == ["L", "R", "S", "alone"]
            assert _notified(listener) == 0, "a claim leaves its lane busy: nothing to wake"
            done = Finish(ActionState.DONE, "DONE")
            alone = claimed["alone"]
            assert await store.finish(alone.token, done)
            assert _notified(listener) == 0, "no successor, nothing to wake"
            retried = claimed["R"]
            retry = Finish(ActionState.ADMITTED, after=timedelta(minutes=5))
            assert await store.finish(retried.token, retry)
            assert _notified(listener) == 0, "the head waits for its retry: nothing due"
            first = claimed["L"]
            assert await store.finish(first.token, done)
            assert _notified(listener) == 1, "the successor is due: the claimers must hear it"
            # A lane whose action ran alone has no row; a successor enqueued meanwhile and not
            # yet folded gets its row from the end, which wakes the claimers too.
            with psycopg.connect(database_url) as conn:
                enqueue(conn, request("S", "solo-next"), schema=schema)
                conn.commit()
            assert _notified(listener) == 1, "the enqueue's own wake-up"
            assert await store.finish(claimed["S"].token, done)
            assert _notified(listener) == 1, "the end made the lane's row around a due head"
            nxt = await store.claim({"NOTE": 10}, ob.settings.lease)
    assert sorted(c.action.idempotency_key for c in nxt) == ["second", "solo-next"]
