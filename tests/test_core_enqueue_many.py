"""enqueue_many: ``enqueue`` of each request in order, as one insert for the whole batch.

Checked against the real PostgreSQL: order and ids, idempotency (existing keys, repeated keys,
a racing transaction), refusals that write nothing and leave the transaction usable, the lane
table, one statement (and one NOTIFY) per batch, the SQLAlchemy and async paths, and a hypothesis
property that a batch is indistinguishable from the same requests enqueued one by one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from outbox import (
    Action,
    ActionKind,
    ActionRequest,
    ActionState,
    InvalidActionRequest,
    Outbox,
    UnknownKindError,
    enqueue,
    enqueue_many,
    enqueue_many_async,
    get_action,
)
from outbox.enqueuing import enqueue_many_operation
from tests.support import expected_lanes, fold_lane_intake, lanes, rows, wait_until

NOTE = ActionKind("NOTE")


class CountingCursor(psycopg.Cursor):
    """Records every statement on its connection's ``statements`` (run_sync executes on a cursor
    of the connection it is given, so this sees each round trip enqueue_many makes)."""

    def execute(self, query: Any, params: Any = None, **kwargs: Any) -> CountingCursor:
        self.connection.statements.append(str(query))  # type: ignore[attr-defined]
        return super().execute(query, params, **kwargs)


class CountingConnection(psycopg.Connection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.statements: list[str] = []
        self.cursor_factory = CountingCursor


@pytest.fixture
def outbox(make_outbox):
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    return ob


@pytest.fixture
def counting(outbox, database_url) -> Iterator[CountingConnection]:
    with CountingConnection.connect(database_url) as connection:
        yield connection


@pytest.fixture
def other_schema(database_url, schema) -> Iterator[str]:
    """A second migrated schema, for the same requests enqueued one by one."""
    name = f"{schema}_one_by_one"
    ob = Outbox(database_url, schema=name)
    ob.declare(NOTE)
    ob.migrate()
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def twin(outbox, database_url, schema, other_schema) -> Iterator[tuple]:
    """A connection of its own (closed before ``other_schema`` is dropped, so the drop never
    waits for its transaction), the test's schema, and the one-by-one schema."""
    with psycopg.connect(database_url) as conn:
        yield conn, schema, other_schema


def request(key: str, lane: str = "lane", **fields: Any) -> ActionRequest:
    values: dict[str, Any] = {
        "kind": NOTE,
        "lane_key": lane,
        "idempotency_key": key,
        "workspace_id": "w1",
    }
    values.update(fields)
    return ActionRequest(**values)


def keys(conn: psycopg.Connection, schema: str) -> list[str]:
    return [r["idempotency_key"] for r in rows(conn, schema)]


def normalised_lanes(conn: psycopg.Connection, schema: str) -> list[tuple]:
    """Lane rows with ids turned into idempotency keys and due times into due-or-not, so two
    schemas (whose ids and clocks differ) compare; once the lane intake is folded."""
    fold_lane_intake(conn, schema)
    return conn.execute(
        f"""
        SELECT l.lane_key, h.idempotency_key, l.head_kind, l.head_due_at IS NOT NULL,
               x.idempotency_key
          FROM "{schema}".agent_action_lane l
          LEFT JOIN "{schema}".agent_action h ON h.id = l.head_id
          LEFT JOIN "{schema}".agent_action x ON x.id = l.executing_id
         ORDER BY l.lane_key
        """
    ).fetchall()


def summary(action: Action) -> tuple:
    """What an action says apart from its id and clock times."""
    return (
        action.idempotency_key,
        action.kind,
        action.state,
        action.workspace_id,
        action.lane_key,
        action.payload,
        action.subject_account_id,
        action.max_attempts,
        action.expires_at,
        action.created,
    )


# -- order, ids, shape --------------------------------------------------------------------------


def test_one_action_per_request_in_request_order_with_rising_ids(outbox, conn, schema):
    requests = [
        request(f"k{i}", lane=f"L{i % 3}", payload={"i": i}, subject_account_id=i)
        for i in range(12)
    ]
    actions = enqueue_many(conn, requests, schema=schema)
    conn.commit()
    assert [a.idempotency_key for a in actions] == [f"k{i}" for i in range(12)]
    assert [a.payload for a in actions] == [{"i": i} for i in range(12)]
    assert all(a.created and a.state is ActionState.ADMITTED for a in actions)
    ids = [a.id for a in actions]
    assert ids == sorted(ids) and len(set(ids)) == 12
    stored = rows(conn, schema)
    assert [(r["id"], r["idempotency_key"]) for r in stored] == [
        (a.id, a.idempotency_key) for a in actions
    ]
    assert stored[3]["subject_account_id"] == "3" and stored[3]["workspace_id"] == "w1"


def test_ids_follow_request_order_not_key_order(outbox, conn, schema):
    # Keys in descending order: an insert that sorted by key (or by anything but the request's
    # position) would give rising ids to the wrong requests.
    requests = [request(f"key-{n:03d}", lane=f"L{n % 2}") for n in range(300, 0, -1)]
    actions = enqueue_many(conn, requests, schema=schema)
    assert [a.idempotency_key for a in actions] == [r.idempotency_key for r in requests]
    assert [a.id for a in actions] == sorted(a.id for a in actions)
    by_id = [r["idempotency_key"] for r in rows(conn, schema)]
    assert by_id == [r.idempotency_key for r in requests]


def test_proposals_start_proposed_and_others_admitted(outbox, conn, schema):
    actions = enqueue_many(
        conn,
        [request("p", proposal=True), request("a"), request("e", kind="EMAIL", workspace_id=None)],
        schema=schema,
    )
    assert [a.state for a in actions] == [
        ActionState.PROPOSED,
        ActionState.ADMITTED,
        ActionState.ADMITTED,
    ]
    assert actions[2].workspace_id is None and actions[2].kind == "EMAIL"


def test_a_created_action_is_the_row_the_database_stored(outbox, conn, schema):
    # The insert returns only what the database made; the rest of the returned action comes from
    # the request, and must say what reading the row back says, field by field.
    later = datetime.now(UTC) + timedelta(hours=1)
    requests = [
        request("plain", payload={"b": [1, 2.5, None, "é"], "a": {"x": True}}),
        request(
            "full",
            lane="other",
            workspace_id=7,
            subject_account_id=42,
            limit_key=3,
            priority=-5,
            max_attempts=9,
            proposal=True,
            not_before=later,
            expires_at=later + timedelta(days=1),
        ),
        request("scheduled", not_before=later.astimezone(timezone(timedelta(hours=5)))),
        request("instance", kind="EMAIL", workspace_id=None, payload=[]),
    ]
    batch = enqueue_many(conn, requests, schema=schema)
    single = [
        enqueue(conn, replace(r, idempotency_key=f"{r.idempotency_key}#1"), schema=schema)
        for r in requests
    ]
    for action in batch + single:
        assert action.created
        stored = get_action(conn, action.id, schema=schema)
        assert stored is not None
        assert replace(action, created=False) == stored, (action, stored)
    payload = requests[0].payload
    assert batch[0].payload is not payload and single[0].payload is not payload
    payload["a"]["x"] = False  # the caller's object is the caller's
    assert batch[0].payload["a"] == {"x": True} == single[0].payload["a"]


def test_empty_batch_returns_nothing_and_runs_no_statement(counting, schema):
    assert enqueue_many(counting, [], schema=schema) == []
    assert counting.statements == []


def test_the_outbox_methods_use_its_schema(outbox, conn, schema):
    actions = outbox.enqueue_many(conn, [request("m1"), request("m2")])
    assert [a.idempotency_key for a in actions] == ["m1", "m2"]
    assert keys(conn, schema) == ["m1", "m2"]


# -- idempotency --------------------------------------------------------------------------------


def test_an_existing_key_returns_its_action_and_changes_nothing(outbox, conn, schema):
    old = enqueue(conn, request("old", payload={"v": "old"}), schema=schema)
    conn.commit()
    actions = enqueue_many(
        conn,
        [request("new1"), request("old", lane="elsewhere", payload={"v": "new"}), request("new2")],
        schema=schema,
    )
    assert actions[1] == replace(old, created=False)
    assert [a.created for a in actions] == [True, False, True]
    assert actions[0].id < actions[2].id
    stored = {r["idempotency_key"]: r for r in rows(conn, schema)}
    assert stored["old"]["payload"] == {"v": "old"} and stored["old"]["lane_key"] == "lane"
    assert len(stored) == 3


def test_a_key_repeated_in_the_batch_returns_the_first_requests_action(outbox, conn, schema):
    actions = enqueue_many(
        conn,
        [
            request("dup", payload={"n": 1}),
            request("x"),
            request("dup", lane="other", payload={"n": 2}, proposal=True),
        ],
        schema=schema,
    )
    assert actions[0].id == actions[2].id
    assert (actions[0].created, actions[2].created) == (True, False)
    assert actions[2].payload == {"n": 1} and actions[2].lane_key == "lane"
    assert actions[2].state is ActionState.ADMITTED
    assert keys(conn, schema) == ["dup", "x"]


def test_an_existing_key_is_never_refused(outbox, conn, schema):
    old = enqueue(conn, request("old"), schema=schema)
    conn.commit()
    # This content would be refused (unknown kind, no workspace, expired), but the key wins.
    past = datetime.now(UTC) - timedelta(days=1)
    actions = enqueue_many(
        conn,
        [
            request("old", kind="NEVER_DECLARED"),
            request("fresh"),
            request("old", kind="NOTE", workspace_id=None, expires_at=past),
        ],
        schema=schema,
    )
    assert [(a.id, a.created) for a in actions] == [
        (old.id, False),
        (actions[1].id, True),
        (old.id, False),
    ]
    assert keys(conn, schema) == ["old", "fresh"]


@pytest.mark.parametrize("holder_commits", [True, False], ids=["holder-commits", "rolls-back"])
def test_a_racing_transaction_holding_a_key_is_waited_for(
    outbox, database_url, schema, holder_commits
):
    with psycopg.connect(database_url) as holder, psycopg.connect(database_url) as batcher:
        held = enqueue(holder, request("race", payload={"by": "holder"}), schema=schema)
        batch = [request("before"), request("race", payload={"by": "batch"}), request("after")]
        outcome: dict[str, Any] = {}

        def run() -> None:
            try:
                outcome["actions"] = enqueue_many(batcher, batch, schema=schema)
            except BaseException as error:  # asserted below
                outcome["error"] = error

        pid = batcher.info.backend_pid
        thread = threading.Thread(target=run)
        thread.start()
        with psycopg.connect(database_url, autocommit=True) as observer:

            def blocked() -> bool:
                row = observer.execute("SELECT cardinality(pg_blocking_pids(%s))", [pid]).fetchone()
                return bool(row and row[0])

            assert wait_until(blocked), "the batch should wait for the holder's key"
        (holder.commit if holder_commits else holder.rollback)()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert "error" not in outcome, outcome.get("error")
        before, race, after = outcome["actions"]
        batcher.commit()
        if holder_commits:
            assert (race.id, race.created, race.payload) == (held.id, False, {"by": "holder"})
        else:
            assert (race.created, race.payload) == (True, {"by": "batch"})
            assert before.id < race.id < after.id
        assert before.created and after.created and before.id < after.id
        assert sorted(keys(batcher, schema)) == ["after", "before", "race"]


# -- refusals -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kind": ""}, "kind"),
        ({"lane_key": " "}, "lane_key"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"payload": {"x": float("nan")}}, "payload"),
        ({"payload": None}, "payload"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"expires_at": datetime(2030, 1, 1)}, "expires_at"),
        ({"workspace_id": None}, "workspace_id"),  # an ActionKind that is not instance-level
        ({"subject_account_id": True}, "subject_account_id"),
    ],
)
def test_bad_input_is_refused_before_any_sql(counting, schema, fields, field):
    batch = [request("good-1"), request("bad", **fields), request("good-2")]
    with pytest.raises(InvalidActionRequest) as raised:
        enqueue_many(counting, batch, schema=schema)
    assert raised.value.field == field
    assert counting.statements == []


def refused_cases(db_now: datetime) -> list[tuple[ActionRequest, type, str]]:
    """Requests only the database can refuse, with the error ``enqueue`` raises for each."""
    return [
        (request("r", kind="NEVER_DECLARED"), UnknownKindError, "kind"),
        (request("r", kind="NOTE", workspace_id=None), InvalidActionRequest, "workspace_id"),
        (request("r", expires_at=db_now), InvalidActionRequest, "expires_at"),
        (
            request("r", expires_at=db_now - timedelta(milliseconds=1)),
            InvalidActionRequest,
            "expires_at",
        ),
    ]


@pytest.mark.parametrize("case", range(4))
def test_a_refused_request_raises_what_enqueue_raises_and_writes_nothing(
    outbox, counting, schema, case
):
    conn = counting
    enqueue(conn, request("earlier-in-this-transaction"), schema=schema)
    db_now = conn.execute("SELECT now()").fetchone()[0]
    refused, error_type, field = refused_cases(db_now)[case]
    with pytest.raises(InvalidActionRequest) as single:
        enqueue(conn, refused, schema=schema)
    conn.statements.clear()
    batch = [request("a", lane="A"), request("b", lane="B"), refused, request("c", lane="A")]
    with pytest.raises(InvalidActionRequest) as raised:
        enqueue_many(conn, batch, schema=schema)
    assert type(raised.value) is type(single.value) is error_type
    assert raised.value.field == single.value.field == field
    assert raised.value.message == single.value.message
    assert (raised.value.index, single.value.index) == (2, None)
    assert str(raised.value) == f"request 2: {single.value}"
    # insert (nothing), look up the new keys (none), diagnose: no SQL error among them.
    assert len(conn.statements) == 3
    # Nothing of the batch was written, and the transaction goes on and commits other work.
    assert keys(conn, schema) == ["earlier-in-this-transaction"]
    assert conn.info.transaction_status is psycopg.pq.TransactionStatus.INTRANS
    enqueue_many(conn, [request("after-error")], schema=schema)
    conn.commit()
    assert keys(conn, schema) == ["earlier-in-this-transaction", "after-error"]
    assert lanes(conn, schema) == expected_lanes(conn, schema)


def test_the_first_refused_request_in_order_is_the_one_reported(outbox, conn, schema):
    batch = [
        request("ok"),
        request("no-workspace", kind="NOTE", workspace_id=None),
        request("unknown", kind="NEVER_DECLARED"),
    ]
    with pytest.raises(InvalidActionRequest) as raised:
        enqueue_many(conn, batch, schema=schema)
    assert raised.value.field == "workspace_id"
    with pytest.raises(UnknownKindError):
        enqueue_many(conn, [batch[0], batch[2], batch[1]], schema=schema)
    assert keys(conn, schema) == []


def test_expiry_is_judged_by_the_database_clock(outbox, conn, schema):
    # now() is the transaction's start: an expires_at after it is accepted even when the
    # application's clock has already passed it, exactly as enqueue does.
    db_now = conn.execute("SELECT now()").fetchone()[0]
    time.sleep(0.05)
    soon = db_now + timedelta(milliseconds=10)
    assert soon < datetime.now(UTC)
    actions = enqueue_many(conn, [request("soon", expires_at=soon)], schema=schema)
    assert actions[0].created and actions[0].expires_at == soon


def test_a_refusal_lifted_by_a_racing_commit_inserts_the_batch(outbox, conn, database_url, schema):
    # Drive the operation by hand: between its insert (held back by the refused request) and its
    # look-up, another transaction commits that request's key, so enqueue one by one would now
    # return that action; the batch inserts again instead of failing.
    batch = [request("ok"), request("late", kind="NEVER_DECLARED")]
    op = enqueue_many_operation(schema, batch)
    with conn.cursor(row_factory=dict_row) as cur:
        statement = next(op)
        cur.execute(statement.sql, statement.params)
        assert cur.fetchall() == []
        with psycopg.connect(database_url) as other:
            late = enqueue(other, request("late"), schema=schema)
            other.commit()
        try:
            while True:
                statement = op.send(cur.fetchall() if cur.description else [])
                cur.execute(statement.sql, statement.params)
        except StopIteration as done:
            actions = done.value
    assert [(a.idempotency_key, a.created) for a in actions] == [("ok", True), ("late", False)]
    assert actions[1].id == late.id


# -- the lane table -----------------------------------------------------------------------------


def mixed_batch() -> list[ActionRequest]:
    return [
        request("a1", lane="A", proposal=True),
        request("b1", lane="B"),
        request("a2", lane="A"),
        request("c1", lane="C", kind="EMAIL", workspace_id=None),
        request("b2", lane="B", proposal=True),
        request("held", lane="H"),
        request("old", lane="B"),  # exists: changes nothing
        request("a1", lane="C"),  # repeated: changes nothing
        request("c2", lane="C"),
    ]


def prepare(conn: psycopg.Connection, schema: str) -> None:
    """Lanes with history: H has an executing action, B an admitted one."""
    enqueue(conn, request("exec", lane="H"), schema=schema)
    enqueue(conn, request("old", lane="B"), schema=schema)
    conn.execute(
        f"UPDATE \"{schema}\".agent_action SET state = 'EXECUTING', epoch = epoch + 1,"
        " lease_until = now() + interval '1 minute'"
        " WHERE idempotency_key = 'exec'"
    )
    conn.commit()


def test_lane_rows_equal_those_of_one_by_one_enqueues(twin):
    conn, schema, other_schema = twin
    prepare(conn, schema)
    prepare(conn, other_schema)
    batched = enqueue_many(conn, mixed_batch(), schema=schema)
    one_by_one = [enqueue(conn, r, schema=other_schema) for r in mixed_batch()]
    conn.commit()
    assert [summary(a) for a in batched] == [summary(a) for a in one_by_one]
    assert normalised_lanes(conn, schema) == normalised_lanes(conn, other_schema)
    assert normalised_lanes(conn, schema) == [
        ("A", "a1", "NOTE", False, None),
        ("B", "old", "NOTE", True, None),
        ("C", "c1", "EMAIL", True, None),
        ("H", "held", "NOTE", True, "exec"),
    ]
    assert lanes(conn, schema) == expected_lanes(conn, schema)


# -- one statement, one NOTIFY ------------------------------------------------------------------


def test_a_batch_of_a_thousand_is_one_statement_and_one_notify(
    outbox, counting, database_url, schema
):
    batch = [request(f"bulk-{i}", lane=f"L{i % 10}") for i in range(1000)]
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f"LISTEN outbox_{schema}")
        actions = enqueue_many(counting, batch, schema=schema)
        assert len(counting.statements) == 1
        counting.commit()
        notices = list(listener.notifies(timeout=1, stop_after=2))
    assert [n.channel for n in notices] == [f"outbox_{schema}"]
    assert len(actions) == 1000 and all(a.created for a in actions)
    assert [a.id for a in actions] == sorted(a.id for a in actions)
    assert len(lanes(counting, schema)) == 10


def test_existing_keys_cost_one_more_statement(outbox, counting, schema):
    enqueue_many(counting, [request(f"k{i}") for i in range(50)], schema=schema)
    counting.statements.clear()
    actions = enqueue_many(counting, [request(f"k{i}") for i in range(100)], schema=schema)
    assert len(counting.statements) == 2  # the insert, then the existing keys in one look-up
    assert [a.created for a in actions] == [False] * 50 + [True] * 50


# -- other connections --------------------------------------------------------------------------


def test_enqueue_many_from_sqlalchemy_rides_its_transaction(outbox, database_url, schema):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(
        database_url.replace("postgresql://", "postgresql+psycopg://")
    )
    with Session(engine) as session:
        enqueue_many(session, [request("sa-rb-1"), request("sa-rb-2")], schema=schema)
        session.rollback()
        actions = enqueue_many(session, [request("sa-1"), request("sa-2")], schema=schema)
        session.commit()
    with engine.connect() as sa_conn:
        enqueue_many(sa_conn, [request("sa-conn"), request("sa-1")], schema=schema)
        sa_conn.commit()
    engine.dispose()
    assert [a.idempotency_key for a in actions] == ["sa-1", "sa-2"]
    with psycopg.connect(database_url) as conn:
        assert keys(conn, schema) == ["sa-1", "sa-2", "sa-conn"]


async def test_async_twin_enqueues_in_the_callers_transaction(outbox, database_url, schema):
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        actions = await enqueue_many_async(conn, [request("x1"), request("x2")], schema=schema)
        again = await outbox.enqueue_many_async(conn, [request("x2"), request("x3")])
        await conn.rollback()
        assert [a.created for a in actions + again] == [True, True, False, True]
        assert again[0].id == actions[1].id
        with pytest.raises(UnknownKindError):
            await enqueue_many_async(conn, [request("y", kind="NEVER_DECLARED")], schema=schema)
        kept = await enqueue_many_async(conn, [request("y1")], schema=schema)
        await conn.commit()
    assert kept[0].created
    with psycopg.connect(database_url) as check:
        assert keys(check, schema) == ["y1"]


# -- the property: a batch is the same as one enqueue after another -----------------------------

KEYS = [f"k{i}" for i in range(6)]
LANES = ["L0", "L1", "L2"]


def requests(kinds: list[str], workspaces: list[str | None]) -> st.SearchStrategy[ActionRequest]:
    return st.builds(
        lambda key, lane, kind, workspace, proposal, n: ActionRequest(
            kind,
            lane_key=lane,
            idempotency_key=key,
            workspace_id=workspace,
            payload={"n": n},
            proposal=proposal,
        ),
        key=st.sampled_from(KEYS),
        lane=st.sampled_from(LANES),
        kind=st.sampled_from(kinds),
        workspace=st.sampled_from(workspaces),
        proposal=st.booleans(),
        n=st.integers(0, 3),
    )


#: Half the batches are all acceptable; the other half often hold a request the database refuses
#: (a kind it does not know, a missing workspace), which only matters when its key is new.
BATCHES = st.one_of(
    st.lists(requests(["NOTE", "NOTE", "EMAIL"], ["w"]), min_size=1, max_size=8),
    st.lists(
        requests(["NOTE", "NOTE", "EMAIL", "NEVER_DECLARED"], ["w", "w", None]),
        min_size=1,
        max_size=8,
    ),
)

VALID = st.builds(
    lambda key, lane, proposal: request(key, lane=lane, proposal=proposal, payload={"pre": 1}),
    key=st.sampled_from(KEYS),
    lane=st.sampled_from(LANES),
    proposal=st.booleans(),
)


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(existing=st.lists(VALID, max_size=3), batch=BATCHES)
def test_a_batch_is_the_same_as_one_enqueue_after_another(twin, existing, batch):
    conn, batched, single = twin
    for name in (batched, single):
        conn.execute(f'DELETE FROM "{name}".agent_action')
        for r in existing:
            enqueue(conn, r, schema=name)
    conn.commit()
    before = keys(conn, batched)

    one_by_one: list[Action] = []
    single_error: InvalidActionRequest | None = None
    single_index = -1
    try:
        for single_index, r in enumerate(batch):  # noqa: B007 (the index of a refusal is kept)
            one_by_one.append(enqueue(conn, r, schema=single))
    except InvalidActionRequest as error:
        single_error = error
    try:
        result: list[Action] | InvalidActionRequest = enqueue_many(conn, batch, schema=batched)
    except InvalidActionRequest as error:
        result = error

    event("refused" if single_error is not None else "accepted")
    if single_error is not None:
        assert isinstance(result, InvalidActionRequest), "the batch accepted a refused request"
        assert (type(result), result.field, result.message, result.index) == (
            type(single_error),
            single_error.field,
            single_error.message,
            single_index,
        )
        assert keys(conn, batched) == before  # nothing of the batch was written
        conn.rollback()
        return
    assert isinstance(result, list), result
    event(f"{sum(not a.created for a in result)} of {len(result)} found, not created")
    assert [summary(a) for a in result] == [summary(a) for a in one_by_one]
    # Ids rise in the same order in both: each key's rank among all ids is the same.
    assert keys(conn, batched) == keys(conn, single)
    assert normalised_lanes(conn, batched) == normalised_lanes(conn, single)
    assert lanes(conn, batched) == expected_lanes(conn, batched)
    conn.rollback()
