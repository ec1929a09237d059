"""Enqueue: in the caller's transaction, idempotent under races, refusing bad input whole."""

from __future__ import annotations

import pickle
import threading
from dataclasses import FrozenInstanceError, fields, replace
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from outbox import (
    ActionKind,
    ActionRequest,
    ActionState,
    IllegalTransition,
    InvalidActionRequest,
    UnknownKindError,
    admit,
    enqueue,
    enqueue_async,
    enqueue_many,
    erase_subject,
    get_action,
    refuse,
)
from outbox._io import Statement, as_sent, run_async, run_sync
from outbox.action import Action, action_maker, created_action
from tests.support import rows

NOTE = ActionKind("NOTE")


@pytest.fixture
def outbox(make_outbox):
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    return ob


def request(key: str = "k1", **fields) -> ActionRequest:
    values = {"kind": NOTE, "lane_key": "lane", "idempotency_key": key, "workspace_id": "w1"}
    values.update(fields)
    return ActionRequest(**values)


def test_rollback_leaves_no_action_and_commit_leaves_exactly_one(outbox, database_url, schema):
    with psycopg.connect(database_url) as conn:
        enqueue(conn, request("rolled-back"), schema=schema)
        conn.rollback()
        action = enqueue(conn, request("committed"), schema=schema)
        conn.commit()
        assert [r["idempotency_key"] for r in rows(conn, schema)] == ["committed"]
        assert action.state is ActionState.ADMITTED and action.created
        assert action.epoch == 0 and action.attempt == 0


def test_enqueue_commits_nothing_itself(outbox, database_url, schema):
    with psycopg.connect(database_url) as writer, psycopg.connect(database_url) as reader:
        enqueue(writer, request(), schema=schema)
        assert rows(reader, schema) == []
        writer.commit()
        assert len(rows(reader, schema)) == 1


def test_second_enqueue_returns_the_first_action_and_changes_nothing(outbox, conn, schema):
    first = enqueue(conn, request(payload={"n": 1}), schema=schema)
    second = enqueue(conn, request(payload={"n": 2}, lane_key="other"), schema=schema)
    assert second.id == first.id and not second.created
    assert [r["payload"] for r in rows(conn, schema)] == [{"n": 1}]


def test_fifty_racing_transactions_with_one_key_make_one_row(outbox, database_url, schema):
    barrier = threading.Barrier(50)
    ids: list[int] = []
    errors: list[BaseException] = []

    def one() -> None:
        try:
            with psycopg.connect(database_url) as conn:
                barrier.wait()
                action = enqueue(conn, request("same-key"), schema=schema)
                ids.append(action.id)
                conn.commit()
        except BaseException as error:  # collected and asserted below
            errors.append(error)

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with psycopg.connect(database_url) as conn:
        table = rows(conn, schema)
    assert len(table) == 1
    assert ids == [table[0]["id"]] * 50


async def test_async_twin_enqueues_in_the_callers_transaction(outbox, database_url, schema):
    async with await psycopg.AsyncConnection.connect(database_url) as conn:
        action = await enqueue_async(conn, request("async"), schema=schema)
        again = await enqueue_async(conn, request("async"), schema=schema)
        await conn.rollback()
    assert again.id == action.id
    with psycopg.connect(database_url) as conn:
        assert rows(conn, schema) == []


def test_enqueue_from_a_sqlalchemy_session_rides_its_transaction(outbox, database_url, schema):
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(
        database_url.replace("postgresql://", "postgresql+psycopg://")
    )
    with Session(engine) as session:
        enqueue(session, request("sa-rollback"), schema=schema)
        session.rollback()
        enqueue(session, request("sa-commit"), schema=schema)
        session.commit()
    with engine.connect() as sa_conn:
        enqueue(sa_conn, request("sa-connection"), schema=schema)
        sa_conn.commit()
    engine.dispose()
    with psycopg.connect(database_url) as conn:
        keys = [r["idempotency_key"] for r in rows(conn, schema)]
    assert keys == ["sa-commit", "sa-connection"]


SYNC_CALLS = {
    "enqueue": (lambda c, s: enqueue(c, request(), schema=s), "call enqueue_async with it"),
    "enqueue_many": (
        lambda c, s: enqueue_many(c, [request()], schema=s),
        "call enqueue_many_async with it",
    ),
    "admit": (lambda c, s: admit(c, 1, schema=s), "call admit_async with it"),
    "refuse": (lambda c, s: refuse(c, 1, schema=s), "call refuse_async with it"),
    "erase_subject": (lambda c, s: erase_subject(c, "a", schema=s), "call erase_subject_async"),
    "get_action": (lambda c, s: get_action(c, 1, schema=s), "give it a psycopg Connection"),
}


@pytest.mark.parametrize("name", sorted(SYNC_CALLS))
@pytest.mark.parametrize("handle", ["psycopg", "sqlalchemy-session", "sqlalchemy-connection"])
async def test_a_sync_call_given_an_async_connection_names_what_to_call_and_writes_nothing(
    outbox, database_url, schema, name, handle
):
    call, advice = SYNC_CALLS[name]
    if handle == "psycopg":
        async with await psycopg.AsyncConnection.connect(database_url) as conn:
            with pytest.raises(TypeError, match=f"^{name} runs on a sync connection") as raised:
                call(conn, schema)
    else:
        pytest.importorskip("sqlalchemy")
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        engine = create_async_engine(database_url.replace("postgresql://", "postgresql+psycopg://"))
        try:
            if handle == "sqlalchemy-session":
                async with AsyncSession(engine) as session:
                    with pytest.raises(TypeError, match=f"^{name} runs on a sync") as raised:
                        call(session, schema)
            else:
                async with engine.connect() as sa_conn:
                    with pytest.raises(TypeError, match=f"^{name} runs on a sync") as raised:
                        call(sa_conn, schema)
        finally:
            await engine.dispose()
    assert advice in str(raised.value)
    with psycopg.connect(database_url) as conn:
        assert rows(conn, schema) == []


def test_enqueue_notifies_claimers_on_commit(outbox, database_url, schema):
    with psycopg.connect(database_url, autocommit=True) as listener:
        listener.execute(f"LISTEN outbox_{schema}")
        with psycopg.connect(database_url) as conn:
            enqueue(conn, request(), schema=schema)
            conn.commit()
        notices = list(listener.notifies(timeout=5, stop_after=1))
    assert [n.channel for n in notices] == [f"outbox_{schema}"]


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"kind": ActionKind("NEVER_DECLARED")}, "kind"),
        ({"kind": "NEVER_DECLARED"}, "kind"),
        ({"kind": ""}, "kind"),
        ({"lane_key": ""}, "lane_key"),
        ({"lane_key": "   "}, "lane_key"),
        ({"idempotency_key": ""}, "idempotency_key"),
        ({"payload": {"when": datetime.now(UTC)}}, "payload"),
        ({"payload": {"x": float("nan")}}, "payload"),
        ({"payload": None}, "payload"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": -3}, "max_attempts"),
        ({"expires_at": datetime.now(UTC) - timedelta(seconds=1)}, "expires_at"),
        ({"expires_at": datetime(2030, 1, 1)}, "expires_at"),
        ({"workspace_id": None}, "workspace_id"),
        ({"kind": "NOTE", "workspace_id": None}, "workspace_id"),
    ],
)
def test_bad_input_names_the_field_and_writes_nothing(outbox, conn, schema, fields, field):
    with pytest.raises(InvalidActionRequest) as raised:
        enqueue(conn, request(**fields), schema=schema)
    assert raised.value.field == field
    if field == "kind" and fields["kind"]:
        assert isinstance(raised.value, UnknownKindError)
    # The caller's transaction is intact: it can go on and commit other work.
    enqueue(conn, request("after-error"), schema=schema)
    conn.commit()
    assert [r["idempotency_key"] for r in rows(conn, schema)] == ["after-error"]


def test_instance_level_kind_needs_no_workspace(outbox, conn, schema):
    action = enqueue(
        conn, ActionRequest("EMAIL", lane_key="a@x", idempotency_key="e1"), schema=schema
    )
    assert action.workspace_id is None and action.kind == "EMAIL"


def test_ids_are_stored_as_text(outbox, conn, schema):
    action = enqueue(conn, request(workspace_id=42, subject_account_id=7), schema=schema)
    assert (action.workspace_id, action.subject_account_id) == ("42", "7")


def test_proposal_waits_and_admit_or_refuse_decides(outbox, conn, schema):
    proposed = enqueue(conn, request("p1", proposal=True), schema=schema)
    refused = enqueue(conn, request("p2", proposal=True), schema=schema)
    assert proposed.state is ActionState.PROPOSED
    admitted = admit(conn, proposed.id, schema=schema)
    assert admitted.state is ActionState.ADMITTED
    ended = refuse(conn, refused.id, "not today", schema=schema)
    assert (ended.state, ended.stop_reason, ended.payload) == (
        ActionState.CANCELLED,
        "not today",
        None,
    )
    with pytest.raises(IllegalTransition):
        admit(conn, refused.id, schema=schema)
    with pytest.raises(IllegalTransition):
        refuse(conn, admitted.id, schema=schema)


def _sums(value: int, *, tuples: bool):
    """A statement with a name used twice and a literal ``%``, run once."""
    rows = yield Statement(
        "SELECT %(a)s::int + %(a)s::int AS twice, 7 %% 4 AS rest", {"a": value}, tuples=tuples
    )
    return rows


def test_an_enqueued_action_is_made_as_the_dataclass_would_make_it():
    # created_action sets the slots itself and then makes the object an Action: each field must
    # get its own value (each one here differs from every other), and the action must be an
    # ordinary frozen Action.
    when = [datetime(2030, 1, day, tzinfo=UTC) for day in (1, 2, 3)]
    given = (
        7, when[1], when[2], {"n": 1}, "NOTE", ActionState.PROPOSED, "w", "lane", "key", "acct",
        4, when[0], -3, "limit",
    )  # fmt: skip
    made = created_action(*given)
    expected = Action(
        id=7,
        kind="NOTE",
        state=ActionState.PROPOSED,
        workspace_id="w",
        lane_key="lane",
        idempotency_key="key",
        payload={"n": 1},
        subject_account_id="acct",
        max_attempts=4,
        expires_at=when[0],
        attempt=0,
        epoch=0,
        available_at=when[1],
        lease_until=None,
        write_started_at=None,
        readback_ref=None,
        stop_reason=None,
        created_at=when[2],
        ended_at=None,
        priority=-3,
        limit_key="limit",
        created=True,
    )
    assert type(made) is Action
    assert [getattr(made, f.name) for f in fields(Action)] == [
        getattr(expected, f.name) for f in fields(Action)
    ]
    assert made == expected and repr(made) == repr(expected)
    assert hash(replace(made, payload=None)) == hash(replace(expected, payload=None))
    assert pickle.loads(pickle.dumps(made)) == expected
    with pytest.raises(FrozenInstanceError):
        made.attempt = 1  # type: ignore[misc]


def test_a_statement_is_sent_with_numbered_placeholders_and_its_values_in_order():
    statement = Statement("SELECT %(b)s, %(a)s, %(b)s, 7 %% 4", {"a": 1, "b": 2})
    assert as_sent(statement) == (b"SELECT $1, $2, $1, 7 % 4", [2, 1])
    assert as_sent(Statement("SELECT %(a)s, 'é'", {"a": 1})) == ("SELECT $1, 'é'", [1])
    # Without values psycopg sends the text as it is, and so does the raw cursor.
    assert as_sent(Statement("SELECT 7 %% 4")) == ("SELECT 7 %% 4", None)


async def test_rows_come_back_as_dicts_or_as_tuples_where_the_statement_asks(database_url):
    with psycopg.connect(database_url) as conn:
        assert run_sync(conn, _sums(2, tuples=False)) == [{"twice": 4, "rest": 3}]
        assert run_sync(conn, _sums(2, tuples=True)) == [(4, 3)]
    async with await psycopg.AsyncConnection.connect(database_url) as aconn:
        assert await run_async(aconn, _sums(3, tuples=False)) == [{"twice": 6, "rest": 3}]
        assert await run_async(aconn, _sums(3, tuples=True)) == [(6, 3)]


@pytest.mark.parametrize("factory", [psycopg.ClientCursor, psycopg.Cursor])
def test_a_connection_given_its_own_cursor_class_runs_the_enqueue_on_it(
    outbox, database_url, schema, factory
):
    """Client-side binding (Django's default) stays the caller's choice: the enqueue runs on
    the connection's cursor class, not on a raw cursor of its own."""
    sent: list[str] = []

    class Seeing(factory):  # type: ignore[misc, valid-type]
        def execute(self, query, params=None, **kwargs):
            sent.append(str(query))
            return super().execute(query, params, **kwargs)

    with psycopg.connect(database_url, cursor_factory=Seeing) as conn:
        first = enqueue(conn, request("own-cursor"), schema=schema)
        again = enqueue(conn, request("own-cursor"), schema=schema)
        conn.commit()
        # The insert; then the insert again and the read of the key.
        assert len(sent) == 3 and "%(idempotency_key)s" in sent[0]
        assert first.created and again.id == first.id and not again.created
        assert len(rows(conn, schema)) == 1


def action_row(state) -> dict:
    """A row of every column ``from_row`` reads (each value differs from every other), and two
    it ignores."""
    when = [datetime(2030, 1, day, tzinfo=UTC) for day in range(1, 8)]
    return {
        "id": 7, "kind": "NOTE", "state": state, "workspace_id": "w", "lane_key": "lane",
        "idempotency_key": "key", "payload": {"n": 1}, "subject_account_id": "acct",
        "max_attempts": 4, "expires_at": when[0], "attempt": 2, "epoch": 3,
        "available_at": when[1], "lease_until": when[2], "write_started_at": when[3],
        "readback_ref": "ref", "stop_reason": "stop", "created_at": when[4],
        "ended_at": when[5], "retry_reason": "again", "earlier_write_at": when[6],
        "priority": -3, "lease_left": "ignored", "walked": ["ignored"],
    }  # fmt: skip


@pytest.mark.parametrize("state", [ActionState.EXECUTING, "DONE"])
def test_an_action_read_from_a_row_is_made_as_the_dataclass_would_make_it(state):
    # from_row sets the slots itself: each field gets its own column, a column the row lacks
    # (limit_key, created) takes the field's default, and other columns are ignored.
    row = action_row(state)
    made = Action.from_row(row)
    given = {k: v for k, v in row.items() if k not in ("lease_left", "walked")}
    assert type(made) is Action
    assert made == Action(**{**given, "state": ActionState(state)})
    assert made.state is ActionState(state)
    assert (made.limit_key, made.created) == (None, False)
    with pytest.raises(FrozenInstanceError):
        made.epoch = 4  # type: ignore[misc]


@pytest.mark.parametrize("extra", [{}, {"limit_key": "key-of-limits", "created": True}])
@pytest.mark.parametrize("state", [ActionState.EXECUTING, "DONE"])
def test_an_action_made_from_a_row_tuple_is_made_as_from_its_dict(state, extra):
    # A claim's and a take's rows come as tuples (``action_maker``): the columns in any order,
    # the fields set by position, a field without its column (limit_key, created) defaulted.
    row = {**action_row(state), **extra}
    names = list(reversed(row))
    made = action_maker(names)(tuple(row[name] for name in names))
    assert type(made) is Action and made.state is ActionState(state)
    assert made == Action.from_row(row)
    assert (made.limit_key, made.created) == (extra.get("limit_key"), extra.get("created", False))
    # A finish's successor: its columns named next_*, beside the finish's own.
    successor = action_maker(["id", "epoch", *(f"next_{name}" for name in names)], "next_")
    assert successor((1, 2, *(row[name] for name in names))) == made


def test_a_row_without_a_column_for_a_field_without_default_is_refused():
    with pytest.raises(KeyError, match="epoch"):
        action_maker([name for name in action_row("DONE") if name != "epoch"])


def test_an_action_row_with_an_unknown_state_is_refused():
    with pytest.raises(ValueError, match="LOST"):
        Action.from_row(action_row("LOST"))


def test_a_large_payload_is_stored_compressed_with_lz4_and_reads_back_whole(outbox, conn, schema):
    # PostgreSQL 14+ built with lz4 (Debian's, the official images'): the migration's condition.
    (has_lz4,) = conn.execute(
        "SELECT 'lz4' = ANY (enumvals) FROM pg_settings WHERE name = 'default_toast_compression'"
    ).fetchone()
    assert has_lz4, "this server has no lz4: the test would prove nothing here"
    # About 14 KB of JSON that compresses well, as mail does: TOAST compresses it on the insert.
    text = " ".join(f"word{i % 97}" for i in range(2_000))
    action = enqueue(conn, request("big", payload={"body": text}), schema=schema)
    many = enqueue_many(conn, [request("big-many", payload={"body": text})], schema=schema)
    for id_ in (action.id, many[0].id):
        method, payload, stored = conn.execute(
            f"SELECT pg_column_compression(payload), payload, pg_column_size(payload)"
            f" FROM {schema}.agent_action WHERE id = %s",
            (id_,),
        ).fetchone()
        assert method == "lz4"
        assert payload == {"body": text} and stored < len(text) / 2
