"""The triggers cost a batched statement one call, not one a row, and the guard's statement-level
query lets through only what the guard's checks would: every update that
``agent_action_refuse_update`` refuses when it is called on every row, the guard still refuses,
with the same error."""

from __future__ import annotations

import itertools
from datetime import timedelta

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import run_sync
from outbox.queries import queries_for
from outbox.store import claim_operation

NOTE = ActionKind("NOTE")
ONCE = ActionKind("ONCE", at_most_once=True)
LEASE = timedelta(minutes=5)


@pytest.fixture
def db(make_outbox, database_url, schema):
    ob = make_outbox()
    ob.declare(NOTE, ONCE)
    ob.migrate()
    with psycopg.connect(database_url) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.commit()
        yield conn


_keys = itertools.count()


def _row(conn, kind: str, *, claimed: bool, taken: bool, wrote: bool, ended: bool) -> int:
    """An action of ``kind`` brought where the combination says, by updates the guard allows."""
    n = next(_keys)
    action_id = conn.execute(
        "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload)"
        " VALUES (%s, 'w', %s, %s, '{}') RETURNING id",
        (kind, f"lane-{n}", f"key-{n}"),
    ).fetchone()[0]
    if claimed:
        conn.execute(
            "UPDATE agent_action SET state = 'EXECUTING', epoch = epoch + 1,"
            " lease_until = now() + interval '1 hour' WHERE id = %s",
            (action_id,),
        )
    if taken:
        conn.execute(
            "UPDATE agent_action SET taken_epoch = epoch, attempt = attempt + 1 WHERE id = %s",
            (action_id,),
        )
    if wrote:
        conn.execute("UPDATE agent_action SET write_started_at = now() WHERE id = %s", (action_id,))
    if ended:
        conn.execute(
            "UPDATE agent_action SET state = 'DONE', stop_reason = 'DONE', payload = NULL,"
            " ended_at = now() WHERE id = %s",
            (action_id,),
        )
    return action_id


#: The update of every combination below: a state, an epoch and attempt step, whether the take
#: is this claim (taken_epoch), and an identity column that may change; the other columns as
#: the row rules want them for the new state.
UPDATE = """
UPDATE agent_action
   SET state = %(state)s, epoch = epoch + %(epoch)s, attempt = attempt + %(attempt)s,
       taken_epoch = CASE WHEN %(taken)s THEN epoch + %(epoch)s ELSE taken_epoch END,
       lane_key = lane_key || %(lane_suffix)s,
       stop_reason = CASE WHEN %(ended)s THEN 'TEST' END,
       payload = CASE WHEN %(ended)s THEN NULL ELSE coalesce(payload, '{}') END,
       ended_at = CASE WHEN %(ended)s THEN now() END,
       lease_until = CASE WHEN %(waiting)s THEN NULL
                          ELSE coalesce(lease_until, now() + interval '1 hour') END,
       write_started_at = CASE WHEN %(waiting)s THEN NULL ELSE write_started_at END
 WHERE id = %(id)s
"""

STATES = ["PROPOSED", "ADMITTED", "EXECUTING", "DONE", "UNCERTAIN", "FAILED", "CANCELLED"]


def _outcomes(conn, rows: list[int]) -> dict[tuple, str | None]:
    """Each combination's error (SQLSTATE and message), or None when the update went through;
    every update rolled back."""
    outcomes: dict[tuple, str | None] = {}
    for action_id, state, epoch, attempt, taken, lane_suffix in itertools.product(
        rows, STATES, (0, 1, 2, -1), (0, 1, 2), (False, True), ("", "x")
    ):
        params = {
            "id": action_id,
            "state": state,
            "epoch": epoch,
            "attempt": attempt,
            "taken": taken,
            "lane_suffix": lane_suffix,
            "ended": state in ("DONE", "UNCERTAIN", "FAILED", "CANCELLED"),
            "waiting": state in ("PROPOSED", "ADMITTED"),
        }
        key = (action_id, state, epoch, attempt, taken, lane_suffix)
        try:
            with conn.transaction():
                conn.execute(UPDATE, params)
                raise _RolledBack
        except _RolledBack:
            outcomes[key] = None
        except psycopg.Error as error:
            outcomes[key] = f"{error.sqlstate} {error.diag.message_primary}"
    return outcomes


class _RolledBack(Exception):
    pass


@pytest.mark.slow
def test_the_guard_refuses_what_it_refuses_when_called_on_every_update(db):
    rows = []
    for kind in ("NOTE", "ONCE"):
        rows.append(_row(db, kind, claimed=False, taken=False, wrote=False, ended=False))
        rows.append(_row(db, kind, claimed=True, taken=False, wrote=False, ended=False))
        rows.append(_row(db, kind, claimed=True, taken=True, wrote=False, ended=False))
        rows.append(_row(db, kind, claimed=True, taken=True, wrote=True, ended=False))
        rows.append(_row(db, kind, claimed=True, taken=True, wrote=True, ended=True))
    proposed = db.execute(
        "INSERT INTO agent_action (kind, state, workspace_id, lane_key, idempotency_key, payload)"
        " VALUES ('NOTE', 'PROPOSED', 'w', 'lane-p', 'key-p', '{}') RETURNING id"
    ).fetchone()[0]
    rows.append(proposed)
    filtered = _outcomes(db, rows)
    # The same updates with the guard's checks called on every one of them, row by row.
    db.execute("DROP TRIGGER guard_agent_action ON agent_action")
    db.execute(
        "CREATE FUNCTION refuse_every_update() RETURNS trigger LANGUAGE plpgsql AS"
        " $$ BEGIN PERFORM agent_action_refuse_update(OLD, NEW); RETURN NEW; END $$"
    )
    db.execute(
        "CREATE TRIGGER guard_agent_action BEFORE UPDATE ON agent_action"
        " FOR EACH ROW EXECUTE FUNCTION refuse_every_update()"
    )
    always = _outcomes(db, rows)
    db.rollback()
    assert filtered == always
    # The comparison covers refusals of every kind, and updates that go through.
    messages = {m for m in always.values() if m is not None}
    assert None in always.values()
    for refusal in (
        "ended",
        "never change",
        "may not go from",
        "the epoch rises",
        "attempt",
        "never claimed again",
    ):
        assert any(refusal in m for m in messages), refusal


def _function_calls(conn) -> dict[str, int]:
    rows = conn.execute(
        "SELECT funcname, calls FROM pg_stat_xact_user_functions"
        " WHERE schemaname = current_schema()"
    ).fetchall()
    return dict(rows)


def test_a_batched_claim_fence_and_finish_call_each_trigger_once_a_statement(db, schema):
    requests = [
        ActionRequest(kind="NOTE", workspace_id="w", lane_key=f"l{i}", idempotency_key=f"k{i}")
        for i in range(20)
    ]
    enqueue_many(db, requests, schema=schema)
    db.commit()
    q = queries_for(schema)
    run_sync(db, claim_operation(schema, {"NOTE": 0}, LEASE, take=True))  # folds the intake
    db.commit()
    db.execute("SET track_functions = 'pl'")
    claimed = run_sync(db, claim_operation(schema, {"NOTE": 20}, LEASE, take=True, intake=False))
    assert len(claimed) == 20
    ids = [c.action.id for c in claimed]
    epochs = [c.action.epoch for c in claimed]
    fenced = db.execute(
        q["begin_writes"],
        {
            "ids": ids,
            "epochs": epochs,
            "margins": [timedelta(0)] * 20,
            "refs": [None] * 20,
            "claimed_ats": [None] * 20,
        },
    ).fetchall()
    finished = db.execute(
        q["finish_many"],
        {
            "ids": ids,
            "epochs": epochs,
            "states": ["DONE"] * 20,
            "stop_reasons": ["DONE"] * 20,
            "refs": [None] * 20,
            "retry_reasons": [None] * 20,
            "afters": [None] * 20,
            "gives_back": [False] * 20,
            "error_classes": [None] * 20,
            "claimed_ats": [None] * 20,
            "fenced": [True] * 20,
            "hand_offs": [None] * 20,
            "retried": [False] * 20,
            "taker": "",
        },
    ).fetchall()
    assert len(fenced) == len(finished) == 20
    calls = _function_calls(db)
    db.commit()
    # The claim (its reclaims and heads, one statement), the fences, the finishes: three UPDATE
    # statements. The guard passes all 40 state changes by its query, without calling the
    # checks' function; no lane had a successor to refresh.
    assert calls.get("agent_action_lanes_moved") == 3, calls
    assert calls.get("guard_agent_action") == 3, calls
    assert "agent_action_refuse_update" not in calls, calls
    assert "agent_action_lane_track" not in calls, calls
    assert "agent_action_lane_refresh" not in calls, calls
    lanes = db.execute("SELECT count(*) FROM agent_action_lane").fetchone()[0]
    assert lanes == 0


def test_an_unknown_kind_is_refused_once_a_statement_as_the_foreign_key_refused_it(db):
    with pytest.raises(psycopg.errors.ForeignKeyViolation) as refused:
        db.execute(
            "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload)"
            " VALUES ('NOTE', 'w', 'a', 'a', '{}'), ('NOT_A_KIND', 'w', 'b', 'b', '{}')"
        )
    assert refused.value.diag.constraint_name == "agent_action_kind_fkey"
    assert "NOT_A_KIND" in (refused.value.diag.message_detail or "")
    db.rollback()
    assert db.execute("SELECT count(*) FROM agent_action").fetchone()[0] == 0
    assert db.execute("SELECT count(*) FROM agent_action_lane_intake").fetchone()[0] == 0


def test_a_kind_that_actions_name_is_neither_deleted_nor_renamed(db, schema):
    enqueue_many(
        db,
        [ActionRequest(kind="NOTE", workspace_id="w", lane_key="l", idempotency_key="k")],
        schema=schema,
    )
    db.commit()
    with pytest.raises(psycopg.errors.ForeignKeyViolation, match="still referenced"):
        db.execute("DELETE FROM agent_action_kind WHERE name = 'NOTE'")
    db.rollback()
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        db.execute("UPDATE agent_action_kind SET name = 'NOTE2' WHERE name = 'NOTE'")
    db.rollback()
    # A flag change and a kind no action names are free, as they were.
    db.execute("UPDATE agent_action_kind SET instance_level = true WHERE name = 'NOTE'")
    db.execute("DELETE FROM agent_action_kind WHERE name = 'ONCE'")
    db.rollback()


def test_a_kind_deleted_while_an_enqueue_holds_it_waits_and_is_refused(db, database_url, schema):
    enqueue_many(
        db,
        [ActionRequest(kind="ONCE", workspace_id="w", lane_key="l", idempotency_key="k")],
        schema=schema,
    )  # not committed: the enqueue's transaction holds the kind
    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute(f'SET search_path TO "{schema}"')
        other.execute("SET lock_timeout = '200ms'")
        with pytest.raises(psycopg.errors.LockNotAvailable):
            other.execute("DELETE FROM agent_action_kind WHERE name = 'ONCE'")
    db.commit()
    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute(f'SET search_path TO "{schema}"')
        with pytest.raises(psycopg.errors.ForeignKeyViolation):
            other.execute("DELETE FROM agent_action_kind WHERE name = 'ONCE'")


def test_an_uncommitted_enqueue_writes_no_lock_on_its_kinds_row(db, database_url, schema):
    # The kind is held by an advisory lock, not a row lock: the kind's row stays as it was (no
    # lock written into it, no MultiXact among concurrent enqueuers), and only a deletion or a
    # rename waits (the test above).
    enqueue_many(
        db,
        [ActionRequest(kind="ONCE", workspace_id="w", lane_key="l", idempotency_key="k")],
        schema=schema,
    )
    with psycopg.connect(database_url, autocommit=True) as other:
        other.execute(f'SET search_path TO "{schema}"')
        locked = other.execute(
            "SELECT name FROM agent_action_kind WHERE name = 'ONCE' FOR UPDATE NOWAIT"
        ).fetchall()
    assert locked == [("ONCE",)]
    db.rollback()
