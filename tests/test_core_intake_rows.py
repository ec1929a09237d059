"""The lane intake's rows: one an insert statement, however many lanes it touched, and a fold
that takes at most its limit of lanes a call, a row in part when it must, and keeps every lane
it could not fold (its lane row held by a finish) for the next claim. Nothing is lost: a lane
whose row does not say what its actions say is always still in the intake."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import ActionKind, ActionRequest, enqueue, enqueue_many
from outbox._io import run_sync
from outbox.store import claim_operation
from tests.support import ScriptedAdapter, expected_lanes

NOTE = ActionKind("NOTE")
LEASE = timedelta(minutes=5)


@pytest.fixture
def ob(make_outbox):
    outbox = make_outbox()
    outbox.register(NOTE, ScriptedAdapter())
    outbox.migrate()
    return outbox


def request(lane: str, key: str, priority: int = 0) -> ActionRequest:
    return ActionRequest(
        NOTE, lane_key=lane, idempotency_key=key, workspace_id="w", priority=priority
    )


def intake(conn: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    """The intake rows in order: (lane_key, lane_keys, lanes, priority)."""
    return conn.execute(
        f'SELECT lane_key, lane_keys, lanes, priority FROM "{schema}".agent_action_lane_intake'
        " ORDER BY seq"
    ).fetchall()


def pending(conn: psycopg.Connection, schema: str) -> list[str]:
    """Every lane the intake still names, once a row, sorted."""
    return sorted(
        lane
        for lane_key, lane_keys, _, _ in intake(conn, schema)
        for lane in (lane_keys if lane_keys is not None else [lane_key])
    )


def lane_rows(conn: psycopg.Connection, schema: str) -> list[tuple[Any, ...]]:
    """The lane rows as they are (no fold first), as ``expected_lanes`` shapes them."""
    return conn.execute(
        "SELECT lane_key, head_id, head_kind, head_due_at, executing_id"
        f' FROM "{schema}".agent_action_lane ORDER BY lane_key'
    ).fetchall()


def fold(conn: psycopg.Connection, schema: str, limit: int) -> int:
    (taken,) = conn.execute(f'SELECT "{schema}".agent_action_lane_intake(%s)', (limit,)).fetchone()
    conn.commit()
    return taken


def test_an_insert_statement_leaves_one_intake_row_for_all_its_lanes(ob, conn):
    batch = [request(f"L{i % 40}", f"k{i}", priority=5 if i % 40 == 7 else 0) for i in range(100)]
    enqueue_many(conn, batch, schema=ob.schema)
    enqueue_many(conn, [request("solo", "s1"), request("solo", "s2")], schema=ob.schema)
    enqueue(conn, request("one", "o1", priority=3), schema=ob.schema)
    conn.commit()
    [many, solo, one] = intake(conn, ob.schema)
    lane_key, lane_keys, lanes, priority = many
    assert lane_key is None and lanes == 40 and priority == 5
    assert sorted(lane_keys) == sorted(f"L{i}" for i in range(40))
    assert lane_keys[0] == "L7", "the highest priority's lane comes first"
    assert solo == ("solo", None, 1, 0)
    assert one == ("one", None, 1, 3)
    assert fold(conn, ob.schema, 1000) == 42
    assert intake(conn, ob.schema) == []
    assert lane_rows(conn, ob.schema) == expected_lanes(conn, ob.schema)


def test_an_insert_of_no_rows_leaves_no_intake_row(ob, conn):
    enqueue(conn, request("A", "a"), schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 100)
    enqueue_many(conn, [request("A", "a"), request("B", "a")], schema=ob.schema)  # key exists
    conn.commit()
    assert intake(conn, ob.schema) == []


def test_a_fold_takes_a_prefix_of_a_large_row_and_leaves_the_rest(ob, conn):
    enqueue_many(conn, [request(f"L{i:03}", f"k{i}") for i in range(250)], schema=ob.schema)
    conn.commit()
    [(_, keys, _, _)] = intake(conn, ob.schema)
    assert fold(conn, ob.schema, 100) == 100
    [(_, rest, lanes, _)] = intake(conn, ob.schema)
    assert (rest, lanes) == (keys[100:], 150)
    assert [row[0] for row in lane_rows(conn, ob.schema)] == sorted(keys[:100])
    assert fold(conn, ob.schema, 100) == 100
    assert fold(conn, ob.schema, 100) == 50
    assert fold(conn, ob.schema, 100) == 0
    assert intake(conn, ob.schema) == []
    assert lane_rows(conn, ob.schema) == expected_lanes(conn, ob.schema)


def test_a_small_transaction_after_a_large_row_is_folded_at_the_next_claim(ob, conn):
    enqueue_many(conn, [request(f"bulk{i}", f"b{i}") for i in range(500)], schema=ob.schema)
    conn.commit()
    enqueue_many(conn, [request("urgent", "u1"), request("urgent2", "u2")], schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 10)
    folded = {row[0] for row in lane_rows(conn, ob.schema)}
    assert {"urgent", "urgent2"} <= folded
    # The large row gave the first 64 of its lanes as one of the newest 64 rows; none twice.
    assert len(folded) == 64 + 2
    assert sorted(pending(conn, ob.schema) + sorted(folded)) == sorted(
        [f"bulk{i}" for i in range(500)] + ["urgent", "urgent2"]
    )


def test_a_fold_by_priority_takes_a_large_rows_urgent_lanes_first(ob, conn):
    enqueue_many(conn, [request(f"old{i}", f"o{i}") for i in range(100)], schema=ob.schema)
    conn.commit()
    urgent = {f"x{i}" for i in range(0, 300, 50)}
    batch = [request(f"x{i}", f"x{i}", priority=9 if f"x{i}" in urgent else 0) for i in range(300)]
    enqueue_many(conn, batch, schema=ob.schema)
    conn.commit()
    for n in range(70):  # 70 later rows: neither large row is among the newest 64
        enqueue(conn, request(f"later{n}", f"l{n}"), schema=ob.schema)
        conn.commit()
    fold(conn, ob.schema, 4)
    folded = {row[0] for row in lane_rows(conn, ob.schema)}
    taken = {lane for lane in folded if lane.startswith("x")}
    assert len(taken) == 4 and taken <= urgent
    assert not any(lane.startswith("old") for lane in folded)


def test_lanes_a_finish_holds_stay_in_their_row_for_the_next_fold(ob, conn, database_url):
    enqueue_many(conn, [request(f"L{i}", f"first{i}") for i in range(80)], schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 100)  # every lane has its row now
    enqueue_many(conn, [request(f"L{i}", f"next{i}") for i in range(80)], schema=ob.schema)
    conn.commit()
    [(_, keys, _, _)] = intake(conn, ob.schema)
    held = [keys[1], keys[75]]  # one inside the prefix the fold takes, one after it
    with psycopg.connect(database_url) as finish:
        finish.execute(
            f'SELECT 1 FROM "{ob.schema}".agent_action_lane WHERE lane_key = ANY (%s) FOR UPDATE',
            (held,),
        )
        assert fold(conn, ob.schema, 70) == 69, "70 taken, one of them held"
        [(_, rest, lanes, _)] = intake(conn, ob.schema)
        assert rest == [keys[1], *keys[70:]] and lanes == 11
        assert fold(conn, ob.schema, 100) == 9, "11 taken, the two held back"
        assert pending(conn, ob.schema) == sorted(held)
    assert fold(conn, ob.schema, 100) == 2
    assert intake(conn, ob.schema) == []
    assert lane_rows(conn, ob.schema) == expected_lanes(conn, ob.schema)


def test_a_row_taken_whole_beside_a_held_lane_leaves(ob, conn, database_url):
    """A fold that could not take every lane rewrites its rows (each keeps what it held back):
    a row it took whole, none of its lanes held, is gone, not left with no lanes."""
    lanes = [f"X{i}" for i in range(10)] + [f"Y{i}" for i in range(10)]
    enqueue_many(conn, [request(lane, f"first-{lane}") for lane in lanes], schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 100)  # every lane has its row now
    for prefix in ("X", "Y"):
        batch = [request(f"{prefix}{i}", f"next-{prefix}{i}") for i in range(10)]
        enqueue_many(conn, batch, schema=ob.schema)
        conn.commit()
    with psycopg.connect(database_url) as finish:
        finish.execute(
            f"SELECT 1 FROM \"{ob.schema}\".agent_action_lane WHERE lane_key = 'Y3' FOR UPDATE"
        )
        assert fold(conn, ob.schema, 100) == 19
        assert intake(conn, ob.schema) == [(None, ["Y3"], 1, 0)]
    assert fold(conn, ob.schema, 100) == 1
    assert intake(conn, ob.schema) == []
    assert lane_rows(conn, ob.schema) == expected_lanes(conn, ob.schema)


def test_a_held_lanes_single_rows_stay_and_count_as_not_taken(ob, conn, database_url):
    enqueue(conn, request("A", "a1"), schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 100)
    for key in ("a2", "a3"):
        enqueue(conn, request("A", key), schema=ob.schema)
        conn.commit()
    enqueue(conn, request("B", "b1"), schema=ob.schema)
    conn.commit()
    with psycopg.connect(database_url) as finish:
        finish.execute(
            f"SELECT 1 FROM \"{ob.schema}\".agent_action_lane WHERE lane_key = 'A' FOR UPDATE"
        )
        assert fold(conn, ob.schema, 100) == 1
        assert pending(conn, ob.schema) == ["A", "A"]
    assert fold(conn, ob.schema, 100) == 2
    assert intake(conn, ob.schema) == []
    assert lane_rows(conn, ob.schema) == expected_lanes(conn, ob.schema)


#: Enough lanes that an insert can carry more than the 64 a fold takes of each newest row,
#: so folds take rows in part.
LANES = [f"L{i}" for i in range(100)]
STEPS = st.lists(
    st.one_of(
        st.tuples(
            st.just("many"),
            st.integers(0, 99),  # the first lane
            st.integers(1, 90),  # how many actions
            st.integers(1, 3),  # the stride through the lanes (3: some lanes twice)
            st.integers(0, 4),  # how priorities vary along the batch
        ),
        st.tuples(st.just("erase"), st.sampled_from(LANES)),
        st.tuples(st.just("claim"), st.integers(1, 30)),
        st.tuples(st.just("end"), st.lists(st.sampled_from(LANES), max_size=8)),
        st.tuples(
            st.just("fold"),
            st.integers(1, 80),
            st.lists(st.sampled_from(LANES), max_size=6),
            st.booleans(),  # whether the finish that holds those lanes ends their actions
        ),
    ),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_a_lane_out_of_step_with_its_actions_is_always_still_in_the_intake(
    ob, conn, database_url, steps
):
    """Inserts of many lanes, claims, ends of executing actions, erasures of heads, and folds
    of small limits while a finish holds some lanes' rows and executing actions (and then ends
    them or not): after every step each lane whose row is wrong is named by the intake, and
    once the holds are gone the folds drain the intake and every lane row is right."""
    s = ob.schema
    conn.execute(
        f'TRUNCATE "{s}".agent_action, "{s}".agent_action_lane, "{s}".agent_action_lane_intake'
    )
    conn.execute("SET lock_timeout = '2s'")
    conn.commit()
    keys = iter(range(10**6))
    with psycopg.connect(database_url) as finish:
        for step in steps:
            if step[0] == "many":
                _, first, count, stride, spread = step
                batch = [
                    request(
                        LANES[(first + j * stride) % len(LANES)],
                        f"k{next(keys)}",
                        priority=(j * spread) % 5 - 2,
                    )
                    for j in range(count)
                ]
                enqueue_many(conn, batch, schema=s)
            elif step[0] == "claim":  # lanes with an executing action: a later insert's
                # lane row is out of step (no head) until a fold
                run_sync(
                    conn, claim_operation(s, {NOTE.name: step[1]}, LEASE, take=True, intake=False)
                )
            elif step[0] == "end":
                end(conn, s, *step[1])
            elif step[0] == "erase":
                conn.execute(
                    f'DELETE FROM "{s}".agent_action WHERE id = (SELECT min(id)'
                    f' FROM "{s}".agent_action WHERE lane_key = %s)',
                    (step[1],),
                )
            else:
                _, limit, held, ends = step
                # A finish under way holds its lane's row, if it has one, and its action; it
                # commits after the fold (ending the actions), or rolls back.
                finish.execute(
                    f'SELECT 1 FROM "{s}".agent_action_lane WHERE lane_key = ANY (%s) FOR UPDATE',
                    (held,),
                )
                end(finish, s, *held)
                fold(conn, s, limit)  # never waits: lock_timeout would fail it
                if ends:
                    finish.commit()
                else:
                    finish.rollback()
            conn.commit()
            actual = {row[0]: row for row in lane_rows(conn, s)}
            expected = {row[0]: row for row in expected_lanes(conn, s)}
            wrong = {
                lane
                for lane in actual.keys() | expected.keys()
                if actual.get(lane) != expected.get(lane)
            }
            assert wrong <= set(pending(conn, s)), f"lost: {wrong - set(pending(conn, s))}"
    for _ in range(100):
        if fold(conn, s, 3) == 0:
            break
    assert intake(conn, s) == []
    assert lane_rows(conn, s) == expected_lanes(conn, s)


def test_the_lane_functions_plan_their_statements_once_a_session(
    ob: Any, database_url: str, schema: str
) -> None:
    """A custom plan a call (PL/pgSQL's default for a statement given an array variable of one
    element) was half the fold's and the lane tracker's time: they keep generic plans, all of
    whose statements stay linear in the arrays; only the fold's slow path, which compares two
    arrays, plans for their lengths."""
    with psycopg.connect(database_url) as conn:
        config = dict(
            conn.execute(
                "SELECT p.proname, p.proconfig FROM pg_proc p"
                " JOIN pg_namespace n ON n.oid = p.pronamespace WHERE n.nspname = %s",
                (schema,),
            ).fetchall()
        )
    generic = ["agent_action_lane_intake", "agent_action_lanes_moved", "agent_action_kinds_waiting"]
    for name in generic:
        assert "plan_cache_mode=force_generic_plan" in (config[name] or []), name
    assert "plan_cache_mode=auto" in config["agent_action_lane_intake_held"]


def claim(conn: psycopg.Connection, schema: str, n: int = 10) -> list[int]:
    """A claim of due lane heads (no fold first), committed: the claimed ids."""
    operation = claim_operation(schema, {NOTE.name: n}, LEASE, take=True, intake=False)
    claimed = run_sync(conn, operation)
    conn.commit()
    return [c.action.id for c in claimed]


def end(conn: psycopg.Connection, schema: str, *lanes: str) -> None:
    """The lanes' executing actions end DONE (a finish's statement, uncommitted)."""
    conn.execute(
        f"UPDATE \"{schema}\".agent_action SET state = 'DONE', stop_reason = 'DONE',"
        " payload = NULL, ended_at = now() WHERE lane_key = ANY (%s) AND state = 'EXECUTING'",
        (list(lanes),),
    )


def test_a_lane_whose_action_runs_alone_has_no_row_until_an_action_waits_behind_it(ob, conn):
    (first,) = enqueue_many(conn, [request("L", "first")], schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 100)
    assert claim(conn, ob.schema) == [first.id]
    assert lane_rows(conn, ob.schema) == []
    (second,) = enqueue_many(conn, [request("L", "second")], schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 100)
    # The fold's row names the executing action, so the waiting one is not a claimable head.
    [(_, head, _, _, executing)] = lane_rows(conn, ob.schema)
    assert (head, executing) == (second.id, first.id)
    assert claim(conn, ob.schema) == []
    end(conn, ob.schema, "L")
    conn.commit()
    assert lane_rows(conn, ob.schema) == expected_lanes(conn, ob.schema)
    assert claim(conn, ob.schema) == [second.id]
    end(conn, ob.schema, "L")
    conn.commit()
    assert lane_rows(conn, ob.schema) == [] and intake(conn, ob.schema) == []


def test_a_fold_leaves_a_lane_whose_executing_action_a_finish_holds_for_the_next_fold(
    ob, conn, database_url
):
    """The fold never waits on an executing action another transaction holds, and never makes
    a row from what that transaction is about to change: the lane stays in the intake."""
    enqueue_many(conn, [request("L", "first")], schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 100)
    claim(conn, ob.schema)
    (second,) = enqueue_many(conn, [request("L", "second")], schema=ob.schema)
    conn.commit()
    conn.execute("SET lock_timeout = '2s'")
    conn.commit()
    with psycopg.connect(database_url) as finish:
        end(finish, ob.schema, "L")
        assert fold(conn, ob.schema, 100) == 0
        assert pending(conn, ob.schema) == ["L"]
        finish.commit()
    fold(conn, ob.schema, 100)
    assert intake(conn, ob.schema) == []
    assert lane_rows(conn, ob.schema) == expected_lanes(conn, ob.schema)
    assert claim(conn, ob.schema) == [second.id]


def test_a_finish_waits_for_the_fold_that_recorded_its_action_and_then_frees_the_lane(
    ob, conn, database_url
):
    """The fold that makes a lane's row around an executing action locks that action until it
    commits: the action's finish waits, then finds the row and hands the lane to its head."""
    enqueue_many(conn, [request("L", "first")], schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 100)
    claim(conn, ob.schema)
    (second,) = enqueue_many(conn, [request("L", "second")], schema=ob.schema)
    conn.commit()
    conn.execute(f'SELECT "{ob.schema}".agent_action_lane_intake(100)')  # not committed yet
    with psycopg.connect(database_url) as finish:
        finish.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            end(finish, ob.schema, "L")
        finish.rollback()
        conn.commit()
        end(finish, ob.schema, "L")
        finish.commit()
    assert intake(conn, ob.schema) == []
    assert lane_rows(conn, ob.schema) == expected_lanes(conn, ob.schema)
    assert claim(conn, ob.schema) == [second.id]


def test_a_lanes_executing_action_is_found_by_the_lane_index_alone(ob, conn):
    """A probe for a lane's executing action can only be served by its lane index: planned on
    the lease index (the same predicate until migration 0022), it read every executing
    action's entry a lane, and a fold of thousands of fresh lanes took that many times longer."""
    enqueue_many(conn, [request(f"L{i}", f"k{i}") for i in range(40)], schema=ob.schema)
    conn.commit()
    fold(conn, ob.schema, 100)
    claim(conn, ob.schema, 30)
    conn.execute(f'SET search_path TO "{ob.schema}"')
    probe = "SELECT a.id FROM agent_action a WHERE a.lane_key = 'L1' AND a.state = 'EXECUTING'"
    plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {probe}").fetchall())
    assert "ux_agent_action_lane_executing" in plan, plan
    # Without the lane index (dropped in this transaction only), no other index serves it.
    conn.execute("DROP INDEX ux_agent_action_lane_executing")
    plan = "\n".join(r[0] for r in conn.execute(f"EXPLAIN {probe}").fetchall())
    assert "ix_agent_action_lease" not in plan, plan
    conn.rollback()
