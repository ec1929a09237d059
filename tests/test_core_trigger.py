"""The guard trigger and ActionState agree on every ordered pair of states, and the trigger
refuses, whoever writes the SQL, every row the lifecycle forbids: an illegal transition, a change
to an ended row, an unknown kind, a missing workspace for a workspace-level kind, an epoch that
does not rise by exactly one on a claim, a fence on a waiting action, a second executing action
in a lane, and a reclaim of an at-most-once action whose write started."""

from __future__ import annotations

import itertools

import psycopg
import pytest

from outbox import ActionKind, ActionState

NOTE = ActionKind("NOTE")
ONCE = ActionKind("ONCE", at_most_once=True)
ENDED = [s for s in ActionState if s.is_ended]


@pytest.fixture
def db(make_outbox, database_url, schema):
    ob = make_outbox()
    ob.declare(NOTE, ONCE)
    ob.migrate()
    with psycopg.connect(database_url) as conn:
        conn.execute(f'SET search_path TO "{schema}"')
        conn.commit()  # a session setting, kept across the tests' rollbacks
        yield conn


_counter = itertools.count()


def insert(conn, state: ActionState = ActionState.ADMITTED, kind: str = "NOTE") -> int:
    n = next(_counter)
    return conn.execute(
        "INSERT INTO agent_action (kind, state, workspace_id, lane_key, idempotency_key, payload)"
        " VALUES (%s, %s, 'w', %s, %s, '{}') RETURNING id",
        (kind, state.value, f"lane-{n}", f"key-{n}"),
    ).fetchone()[0]


def move(conn, action_id: int, new: ActionState) -> None:
    """The canonical update into ``new``: a claim for EXECUTING, an end for ended states."""
    if new is ActionState.EXECUTING:
        conn.execute(
            "UPDATE agent_action SET state = 'EXECUTING', epoch = epoch + 1,"
            " lease_until = now() + interval '1 hour' WHERE id = %s",
            (action_id,),
        )
    elif new.is_ended:
        conn.execute(
            "UPDATE agent_action SET state = %s, stop_reason = 'TEST', payload = NULL,"
            " ended_at = now() WHERE id = %s",
            (new.value, action_id),
        )
    else:
        conn.execute(
            "UPDATE agent_action SET state = %s, lease_until = NULL, write_started_at = NULL,"
            " payload = '{}', stop_reason = NULL, ended_at = NULL WHERE id = %s",
            (new.value, action_id),
        )


def row_in(conn, state: ActionState) -> int:
    """A row brought to ``state`` by legal steps only."""
    if state.is_pending:
        return insert(conn, state)
    action_id = insert(conn)
    move(conn, action_id, ActionState.EXECUTING)
    if state.is_ended:
        move(conn, action_id, state)
    return action_id


def verdict(conn, old: ActionState, new: ActionState) -> bool:
    with conn.transaction(force_rollback=True):
        action_id = row_in(conn, old)
        try:
            with conn.transaction():
                move(conn, action_id, new)
            return True
        except psycopg.errors.CheckViolation:
            return False


def test_trigger_and_action_state_agree_on_all_49_pairs(db):
    pairs = list(itertools.product(ActionState, repeat=2))
    assert len(pairs) == 49
    disagreements = [
        (old.value, new.value, verdict(db, old, new))
        for old, new in pairs
        if verdict(db, old, new) != old.can_become(new)
    ]
    assert disagreements == []


@pytest.mark.parametrize("state", ENDED)
@pytest.mark.parametrize(
    "change",
    [
        "readback_ref = 'x'",
        "stop_reason = 'OTHER'",
        "available_at = now()",
        "subject_account_id = 'a'",
        "max_attempts = 9",
    ],
)
def test_an_ended_row_refuses_every_update(db, state, change):
    action_id = row_in(db, state)
    with pytest.raises(psycopg.errors.CheckViolation, match="never changes"):
        db.execute(f"UPDATE agent_action SET {change} WHERE id = %s", (action_id,))


def test_raw_sql_with_an_unknown_kind_is_refused(db):
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        insert(db, kind="NOT_A_KIND")


def test_workspace_is_required_unless_the_kind_is_instance_level(db):
    with pytest.raises(psycopg.errors.CheckViolation, match="instance-level"):
        db.execute(
            "INSERT INTO agent_action (kind, lane_key, idempotency_key, payload)"
            " VALUES ('NOTE', 'l', 'k', '{}')"
        )
    db.rollback()
    db.execute(
        "INSERT INTO agent_action (kind, lane_key, idempotency_key, payload)"
        " VALUES ('EMAIL', 'l', 'k', '{}')"
    )


@pytest.mark.parametrize(
    "values",
    [
        "('NOTE', 'w', 'l', 'k', '{}', 0)",  # max_attempts < 1
        "('NOTE', 'w', '', 'k', '{}', 1)",  # empty lane
        "('NOTE', 'w', 'l', '', '{}', 1)",  # empty idempotency key
        "('NOTE', 'w', 'l', 'k', NULL, 1)",  # a live action without payload
    ],
)
def test_check_constraints_refuse_bad_rows(db, values):
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(
            "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
            f" max_attempts) VALUES {values}"
        )


def test_ended_state_requires_stop_reason_and_drops_payload(db):
    action_id = row_in(db, ActionState.EXECUTING)
    for change in (
        "state = 'DONE', payload = NULL, ended_at = now()",  # no stop reason
        "state = 'DONE', stop_reason = 'X', ended_at = now()",  # payload kept
    ):
        with pytest.raises(psycopg.errors.CheckViolation), db.transaction():
            db.execute(f"UPDATE agent_action SET {change} WHERE id = %s", (action_id,))


def test_a_new_row_starts_waiting_at_epoch_zero(db):
    for values, message in (
        ("'EXECUTING', 0, now()", "starts PROPOSED or ADMITTED, not EXECUTING"),
        ("'DONE', 0, NULL", None),  # a check constraint (no stop reason) refuses it first
        ("'ADMITTED', 3, NULL", "starts at epoch 0 and attempt 0"),
    ):
        with pytest.raises(psycopg.errors.CheckViolation, match=message), db.transaction():
            db.execute(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
                f" state, epoch, lease_until) VALUES ('NOTE', 'w', 'l', 'k', '{{}}', {values})"
            )


def test_one_bad_row_refuses_a_whole_multi_row_insert_and_leaves_no_lane(db):
    """The insert rules run once a statement over every inserted row (migration 0004)."""
    with pytest.raises(psycopg.errors.CheckViolation, match="not EXECUTING"), db.transaction():
        db.execute(
            "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
            " state, lease_until) VALUES ('NOTE', 'w', 'a', 'k1', '{}', 'ADMITTED', NULL),"
            " ('NOTE', 'w', 'b', 'k2', '{}', 'EXECUTING', now()),"
            " ('NOTE', 'w', 'c', 'k3', '{}', 'ADMITTED', NULL)"
        )
    assert db.execute("SELECT count(*) FROM agent_action").fetchone() == (0,)
    assert db.execute("SELECT count(*) FROM agent_action_lane").fetchone() == (0,)
    # The same rows without the bad one: each lane gets its head, the smallest id of the lane.
    db.execute(
        "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload)"
        " VALUES ('NOTE', 'w', 'a', 'k1', '{}'), ('NOTE', 'w', 'a', 'k2', '{}'),"
        " ('NOTE', 'w', 'c', 'k3', '{}')"
    )
    db.execute("SELECT agent_action_lane_intake(100)")
    lanes = db.execute(
        "SELECT l.lane_key, l.head_id = (SELECT min(id) FROM agent_action a"
        "  WHERE a.lane_key = l.lane_key) FROM agent_action_lane l ORDER BY 1"
    ).fetchall()
    assert lanes == [("a", True), ("c", True)]


@pytest.mark.parametrize(
    "change",
    [
        "state = 'EXECUTING', lease_until = now()",  # claim without epoch rise
        "state = 'EXECUTING', epoch = 2, lease_until = now()",  # epoch + 2
        "state = 'EXECUTING', epoch = 1, attempt = 1, lease_until = now()",  # attempt, no take
        "state = 'EXECUTING', epoch = 1, attempt = 2, taken_epoch = 1, lease_until = now()",
        "epoch = 1",  # epoch moves without a claim
    ],
)
def test_a_claim_raises_the_epoch_by_exactly_one_and_the_attempt_only_with_its_take(db, change):
    action_id = insert(db)
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(f"UPDATE agent_action SET {change} WHERE id = %s", (action_id,))


@pytest.mark.parametrize(
    "change",
    [
        "state = 'EXECUTING', epoch = 1, lease_until = now()",  # a claim: no attempt spent
        "state = 'EXECUTING', epoch = 1, attempt = 1, taken_epoch = 1, lease_until = now()",
    ],
)
def test_a_claim_spends_no_attempt_unless_it_is_the_take(db, change):
    action_id = insert(db)
    db.execute(f"UPDATE agent_action SET {change} WHERE id = %s", (action_id,))


def test_the_epoch_never_falls(db):
    action_id = row_in(db, ActionState.EXECUTING)
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute("UPDATE agent_action SET epoch = epoch - 1 WHERE id = %s", (action_id,))


@pytest.mark.parametrize("column", ["id", "kind", "lane_key", "idempotency_key"])
def test_identity_columns_never_change(db, column):
    action_id = insert(db)
    value = {"id": "id + 1000", "kind": "'EMAIL'"}.get(column, "'changed'")
    # The identity column refuses on its own (GENERATED ALWAYS); the trigger covers the rest.
    refused = (psycopg.errors.CheckViolation, psycopg.errors.GeneratedAlways)
    with pytest.raises(refused):
        db.execute(f"UPDATE agent_action SET {column} = {value} WHERE id = %s", (action_id,))


def test_an_at_most_once_action_whose_write_started_is_never_reclaimed(db):
    once = insert(db, kind="ONCE")
    move(db, once, ActionState.EXECUTING)
    db.execute("UPDATE agent_action SET write_started_at = now() WHERE id = %s", (once,))
    with pytest.raises(psycopg.errors.CheckViolation, match="never claimed again"):
        move(db, once, ActionState.EXECUTING)


def test_a_read_back_action_whose_write_started_may_be_reclaimed(db):
    action_id = row_in(db, ActionState.EXECUTING)
    db.execute("UPDATE agent_action SET write_started_at = now() WHERE id = %s", (action_id,))
    move(db, action_id, ActionState.EXECUTING)
    epoch = db.execute("SELECT epoch FROM agent_action WHERE id = %s", (action_id,)).fetchone()
    assert epoch == (2,)


def test_a_waiting_action_holds_no_fence(db):
    action_id = row_in(db, ActionState.EXECUTING)
    db.execute("UPDATE agent_action SET write_started_at = now() WHERE id = %s", (action_id,))
    with pytest.raises(psycopg.errors.CheckViolation):
        db.execute(
            "UPDATE agent_action SET state = 'ADMITTED', lease_until = NULL WHERE id = %s",
            (action_id,),
        )


def test_one_executing_action_per_lane_even_in_raw_sql(db):
    a = insert(db)
    lane = db.execute("SELECT lane_key FROM agent_action WHERE id = %s", (a,)).fetchone()[0]
    c = db.execute(
        "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload)"
        " VALUES ('NOTE', 'w', %s, 'same-lane', '{}') RETURNING id",
        (lane,),
    ).fetchone()[0]
    move(db, a, ActionState.EXECUTING)
    with pytest.raises(psycopg.errors.UniqueViolation):
        move(db, c, ActionState.EXECUTING)


#: Each row rule, broken by an insert (values for kind, workspace_id, lane_key,
#: idempotency_key, payload, max_attempts, priority) and by an update of an executing row.
RULES = {
    "ck_agent_action_lane_key": ("('NOTE', 'w', '', 'k', '{}', 1, 0)", "lane_key = ''"),
    "ck_agent_action_idempotency_key": (
        "('NOTE', 'w', 'l', '', '{}', 1, 0)",
        "idempotency_key = ''",
    ),
    "ck_agent_action_max_attempts": ("('NOTE', 'w', 'l', 'k', '{}', 0, 0)", "max_attempts = 0"),
    "ck_agent_action_payload": ("('NOTE', 'w', 'l', 'k', NULL, 1, 0)", "payload = NULL"),
    "ck_agent_action_priority": ("('NOTE', 'w', 'l', 'k', '{}', 1, 101)", "priority = -101"),
    "ck_agent_action_executing_leased": (None, "lease_until = NULL"),
    "ck_agent_action_stop_reason": (None, "stop_reason = 'X'"),
    "ck_agent_action_ended_at": (None, "ended_at = now()"),
    "ck_agent_action_state": (None, "state = 'LOST'"),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_each_row_rule_refuses_an_insert_and_an_update_under_its_constraint_name(db, rule):
    """The rules run once a statement in the triggers (a CHECK constraint is prepared anew for
    every statement): each still refuses whoever writes the SQL, naming itself as the
    constraint did."""
    values, change = RULES[rule]
    if values is not None:
        with pytest.raises(psycopg.errors.CheckViolation) as refused, db.transaction():
            db.execute(
                "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
                f" max_attempts, priority) VALUES {values}"
            )
        assert refused.value.diag.constraint_name == rule
    action_id = row_in(db, ActionState.EXECUTING)
    with pytest.raises(psycopg.errors.CheckViolation) as refused, db.transaction():
        db.execute(f"UPDATE agent_action SET {change} WHERE id = %s", (action_id,))
    # The guard refuses a new state outside its table, or a changed key, before the rule does.
    guarded = (
        "ck_agent_action_state",
        "ck_agent_action_lane_key",
        "ck_agent_action_idempotency_key",
    )
    if rule not in guarded:
        assert refused.value.diag.constraint_name == rule


def test_writes_to_an_action_prepare_no_check_or_when_clause_a_statement(db):
    """An insert or an update of agent_action pays no per-statement preparation of CHECK
    constraints or of a row trigger's WHEN clause (about 75 and 100 us a statement): the rules
    and the guard run in statement-level triggers, whose queries plpgsql plans once a session.
    Deletes (erasure, retention) keep their row trigger."""
    checks = db.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = 'agent_action'::regclass"
        " AND contype = 'c'"
    ).fetchall()
    assert checks == []
    row_triggers = db.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'agent_action'::regclass"
        " AND NOT tgisinternal AND tgtype & 1 = 1 AND tgtype & 16 = 16"  # row-level, UPDATE
    ).fetchall()
    assert row_triggers == []


def test_one_bad_row_refuses_a_whole_multi_row_update(db):
    """The guard checks a statement's rows together: one illegal change among legal ones fails
    the statement, and none of its rows changes."""
    first, second, third = (insert(db) for _ in range(3))
    move(db, second, ActionState.EXECUTING)
    db.commit()
    # A claim of all three (the second's a reclaim), but the second's attempt jumps by two,
    # which no claim does.
    with pytest.raises(psycopg.errors.CheckViolation, match="attempt"), db.transaction():
        db.execute(
            "UPDATE agent_action SET state = 'EXECUTING', epoch = epoch + 1,"
            " attempt = attempt + CASE WHEN id = %s THEN 2 ELSE 0 END,"
            " lease_until = now() + interval '1 hour' WHERE id = ANY(%s)",
            (second, [first, second, third]),
        )
    states = db.execute(
        "SELECT state, epoch FROM agent_action WHERE id = ANY(%s) ORDER BY id",
        ([first, second, third],),
    ).fetchall()
    assert states == [("ADMITTED", 0), ("EXECUTING", 1), ("ADMITTED", 0)]


def test_an_update_that_gives_an_action_a_new_id_is_refused(db):
    """GENERATED ALWAYS still lets an update set the id to its default (the next value): the
    guard, which pairs a statement's old and new rows by id, finds a row without its pair."""
    action_id = insert(db)
    with pytest.raises(psycopg.errors.CheckViolation, match="never change"), db.transaction():
        db.execute("UPDATE agent_action SET id = DEFAULT WHERE id = %s", (action_id,))
    assert db.execute("SELECT id FROM agent_action WHERE id = %s", (action_id,)).fetchone()
