"""Enqueue from the stacks applications run on: psycopg2, SQLAlchemy on psycopg2, SQLAlchemy's
asyncio sessions on asyncpg and psycopg, and asyncpg itself. Each on the real database: what the
caller rolls back leaves no action, what it commits leaves exactly the actions it enqueued, and
those run (the lane intake saw them). Django has its own file (test_integrations_django.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox import (
    ActionKind,
    ActionRequest,
    ActionState,
    Done,
    UnusableConnection,
    admit,
    admit_async,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    refuse,
    refuse_async,
)
from outbox.placeholders import numbered
from outbox.queries import queries_for
from outbox.testing import drain
from tests.support import rows

psycopg2 = pytest.importorskip("psycopg2")
asyncpg = pytest.importorskip("asyncpg")
sqlalchemy = pytest.importorskip("sqlalchemy")

NOTE = ActionKind("NOTE")


class Ran:
    """The adapter: records the payload of every action it carried out."""

    def __init__(self) -> None:
        self.payloads: list[Any] = []

    async def execute(self, attempt):
        self.payloads.append(attempt.payload)
        return Done("noted")


@pytest.fixture
def ran() -> Ran:
    return Ran()


@pytest.fixture
def outbox(make_outbox, ran):
    ob = make_outbox()
    ob.register(NOTE, ran)
    ob.migrate()
    return ob


def request(key: str, **fields: Any) -> ActionRequest:
    values: dict[str, Any] = {
        "kind": NOTE,
        "lane_key": f"lane:{key}",
        "idempotency_key": key,
        "workspace_id": "w1",
        "payload": {"key": key, "text": "héllo % %(x)s"},
    }
    values.update(fields)
    return ActionRequest(**values)


def _url(database_url: str, driver: str) -> str:
    return database_url.replace("postgresql://", f"postgresql+{driver}://", 1)


# -- the sync stacks: each a unit of work that commits or rolls back at its end --------------


@contextmanager
def psycopg2_connection(database_url: str, commit: bool) -> Iterator[Any]:
    conn = psycopg2.connect(database_url)
    try:
        yield conn
        conn.commit() if commit else conn.rollback()
    finally:
        conn.close()


@contextmanager
def sqlalchemy_session_psycopg2(database_url: str, commit: bool) -> Iterator[Any]:
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine(_url(database_url, "psycopg2"))
    try:
        with Session(engine) as session:
            yield session
            session.commit() if commit else session.rollback()
    finally:
        engine.dispose()


@contextmanager
def sqlalchemy_connection_psycopg2(database_url: str, commit: bool) -> Iterator[Any]:
    engine = sqlalchemy.create_engine(_url(database_url, "psycopg2"))
    try:
        with engine.connect() as conn:
            yield conn
            conn.commit() if commit else conn.rollback()
    finally:
        engine.dispose()


SYNC_STACKS: dict[str, Callable[[str, bool], Any]] = {
    "psycopg2": psycopg2_connection,
    "sqlalchemy-session-psycopg2": sqlalchemy_session_psycopg2,
    "sqlalchemy-connection-psycopg2": sqlalchemy_connection_psycopg2,
}


# -- the async stacks --------------------------------------------------------------------------


@asynccontextmanager
async def asyncpg_connection(database_url: str, commit: bool) -> AsyncIterator[Any]:
    conn = await asyncpg.connect(database_url)
    try:
        transaction = conn.transaction()
        await transaction.start()
        yield conn
        await (transaction.commit() if commit else transaction.rollback())
    finally:
        await conn.close()


def _async_session(driver: str):
    @asynccontextmanager
    async def stack(database_url: str, commit: bool) -> AsyncIterator[Any]:
        from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

        engine = create_async_engine(_url(database_url, driver))
        try:
            async with AsyncSession(engine) as session:
                yield session
                await (session.commit() if commit else session.rollback())
        finally:
            await engine.dispose()

    return stack


@asynccontextmanager
async def sqlalchemy_async_connection_asyncpg(database_url: str, commit: bool):
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(_url(database_url, "asyncpg"))
    try:
        async with engine.connect() as conn:
            yield conn
            await (conn.commit() if commit else conn.rollback())
    finally:
        await engine.dispose()


ASYNC_STACKS: dict[str, Callable[[str, bool], Any]] = {
    "asyncpg": asyncpg_connection,
    "sqlalchemy-asyncsession-asyncpg": _async_session("asyncpg"),
    "sqlalchemy-asyncconnection-asyncpg": sqlalchemy_async_connection_asyncpg,
    "sqlalchemy-asyncsession-psycopg": _async_session("psycopg"),
}


def _committed(database_url: str, schema: str) -> dict[str, dict[str, Any]]:
    with psycopg.connect(database_url) as conn:
        return {r["idempotency_key"]: r for r in rows(conn, schema)}


def _check_the_unit_of_work(outbox, ran, database_url, schema, results) -> None:
    one, many, proposed, refused_one = results
    assert (
        one.created and one.state is ActionState.ADMITTED and one.payload["text"] == "héllo % %(x)s"
    )
    assert [a.idempotency_key for a in many] == ["many-1", "many-2", "many-1"]
    assert [a.created for a in many] == [True, True, False]
    assert proposed.state is ActionState.ADMITTED
    assert (refused_one.state, refused_one.stop_reason) == (ActionState.CANCELLED, "no thanks")
    table = _committed(database_url, schema)
    # The rolled-back unit of work left nothing; the committed one exactly its actions.
    assert sorted(table) == ["committed", "many-1", "many-2", "proposed", "refused"]
    report = drain(outbox, timeout=60)
    assert report is not None
    assert sorted(p["key"] for p in ran.payloads) == ["committed", "many-1", "many-2", "proposed"]
    ended = _committed(database_url, schema)
    assert {k: r["state"] for k, r in ended.items()} == {
        "committed": "DONE",
        "many-1": "DONE",
        "many-2": "DONE",
        "proposed": "DONE",
        "refused": "CANCELLED",
    }


@pytest.mark.parametrize("stack", sorted(SYNC_STACKS))
def test_a_sync_stack_rolls_back_to_nothing_and_commits_exactly_its_actions(
    outbox, ran, database_url, schema, stack
):
    unit_of_work = SYNC_STACKS[stack]
    with unit_of_work(database_url, commit=False) as conn:
        enqueue(conn, request("rolled-back"), schema=schema)
        enqueue_many(conn, [request("rolled-back-many")], schema=schema)
    assert _committed(database_url, schema) == {}
    with unit_of_work(database_url, commit=True) as conn:
        one = enqueue(conn, request("committed"), schema=schema)
        assert enqueue(conn, request("committed"), schema=schema).id == one.id
        many = enqueue_many(
            conn, [request("many-1"), request("many-2"), request("many-1")], schema=schema
        )
        proposed = admit(
            conn, enqueue(conn, request("proposed", proposal=True), schema=schema).id, schema=schema
        )
        refused_one = refuse(
            conn,
            enqueue(conn, request("refused", proposal=True), schema=schema).id,
            "no thanks",
            schema=schema,
        )
    _check_the_unit_of_work(outbox, ran, database_url, schema, (one, many, proposed, refused_one))


@pytest.mark.parametrize("stack", sorted(ASYNC_STACKS))
async def test_an_async_stack_rolls_back_to_nothing_and_commits_exactly_its_actions(
    outbox, ran, database_url, schema, stack
):
    unit_of_work = ASYNC_STACKS[stack]
    async with unit_of_work(database_url, commit=False) as conn:
        await enqueue_async(conn, request("rolled-back"), schema=schema)
        await enqueue_many_async(conn, [request("rolled-back-many")], schema=schema)
    assert _committed(database_url, schema) == {}
    async with unit_of_work(database_url, commit=True) as conn:
        one = await enqueue_async(conn, request("committed"), schema=schema)
        assert (await enqueue_async(conn, request("committed"), schema=schema)).id == one.id
        many = await enqueue_many_async(
            conn, [request("many-1"), request("many-2"), request("many-1")], schema=schema
        )
        waiting = await enqueue_async(conn, request("proposed", proposal=True), schema=schema)
        proposed = await admit_async(conn, waiting.id, schema=schema)
        waiting = await enqueue_async(conn, request("refused", proposal=True), schema=schema)
        refused_one = await refuse_async(conn, waiting.id, "no thanks", schema=schema)
    # drain runs its own event loop: off this one.
    await asyncio.to_thread(
        _check_the_unit_of_work,
        outbox,
        ran,
        database_url,
        schema,
        (one, many, proposed, refused_one),
    )


@pytest.mark.parametrize("stack", sorted(SYNC_STACKS))
def test_a_refused_request_leaves_the_sync_stacks_transaction_usable(
    outbox, database_url, schema, stack
):
    from outbox import UnknownKindError

    with SYNC_STACKS[stack](database_url, commit=True) as conn:
        with pytest.raises(UnknownKindError):
            enqueue(conn, request("unknown", kind="NEVER_DECLARED"), schema=schema)
        enqueue(conn, request("after"), schema=schema)
    assert sorted(_committed(database_url, schema)) == ["after"]


# -- connections they cannot use --------------------------------------------------------------


def test_a_closed_psycopg2_connection_is_refused_in_one_line(outbox, database_url, schema):
    conn = psycopg2.connect(database_url)
    conn.close()
    with pytest.raises(UnusableConnection, match=r"^enqueue cannot use a closed psycopg2 "):
        enqueue(conn, request("x"), schema=schema)


def test_a_closed_psycopg_connection_is_refused_in_one_line(outbox, database_url, schema):
    conn = psycopg.connect(database_url)
    conn.close()
    with pytest.raises(UnusableConnection, match=r"^enqueue cannot use a closed psycopg "):
        enqueue(conn, request("x"), schema=schema)


@pytest.mark.parametrize("thing", [object(), "postgresql://x", None, 42])
def test_an_unknown_object_is_refused_naming_its_type(outbox, schema, thing):
    with pytest.raises(UnusableConnection) as raised:
        enqueue(thing, request("x"), schema=schema)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"enqueue cannot use {type(thing).__name__} ")
    assert "psycopg2 connection" in message and "transaction.atomic()" in message


async def test_an_unknown_object_is_refused_by_the_async_calls(outbox, schema):
    with pytest.raises(UnusableConnection, match=r"^enqueue_async cannot use object "):
        await enqueue_async(object(), request("x"), schema=schema)


async def test_asyncpg_outside_a_transaction_is_refused_and_writes_nothing(
    outbox, database_url, schema
):
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(UnusableConnection, match=r"needs a transaction on the asyncpg"):
            await enqueue_async(conn, request("x"), schema=schema)
    finally:
        await conn.close()
    with pytest.raises(UnusableConnection, match=r"cannot use a closed asyncpg"):
        await enqueue_async(conn, request("x"), schema=schema)
    assert _committed(database_url, schema) == {}


async def test_sqlalchemy_asyncpg_in_autocommit_is_refused(outbox, database_url, schema):
    from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

    engine = create_async_engine(_url(database_url, "asyncpg"), isolation_level="AUTOCOMMIT")
    try:
        async with AsyncSession(engine) as session:
            with pytest.raises(UnusableConnection, match=r"needs a transaction"):
                await enqueue_async(session, request("x"), schema=schema)
    finally:
        await engine.dispose()
    assert _committed(database_url, schema) == {}


async def test_each_side_names_the_twin_to_call(outbox, database_url, schema):
    conn = await asyncpg.connect(database_url)
    try:
        with pytest.raises(UnusableConnection, match=r"^enqueue runs on a sync .*enqueue_async"):
            enqueue(conn, request("x"), schema=schema)
    finally:
        await conn.close()
    sync = psycopg2.connect(database_url)
    try:
        with pytest.raises(UnusableConnection, match=r"^enqueue_async runs on an async .*enqueue"):
            await enqueue_async(sync, request("x"), schema=schema)
    finally:
        sync.close()


def test_sqlalchemy_on_a_driver_the_outbox_cannot_use_is_refused(outbox, schema):
    from sqlalchemy.orm import Session

    engine = sqlalchemy.create_engine("sqlite://")
    with Session(engine) as session, pytest.raises(UnusableConnection) as raised:
        enqueue(session, request("x"), schema=schema)
    assert "sqlite3" in str(raised.value) and "postgresql+psycopg2://" in str(raised.value)


# -- placeholders: pyformat in queries.sql, $n for asyncpg --------------------------------------

_names = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)
_text = st.text(alphabet=st.sampled_from(list("ab ,()'$:\n")), max_size=6)


@given(st.lists(st.tuples(_text, _names), max_size=8), _text)
def test_each_name_gets_one_number_in_order_of_first_use(parts, tail):
    sql = "".join(f"{text}%({name})s" for text, name in parts) + tail + "%%"
    converted, names = numbered(sql)
    assert names == list(dict.fromkeys(name for _, name in parts))
    expected = "".join(f"{text}${names.index(name) + 1}" for text, name in parts) + tail + "%"
    assert converted == expected


def test_a_cast_follows_every_use_of_its_name():
    sql, names = numbered(
        "SELECT %(a)s, %(p)s, %(a)s::int, %(p)s", frozenset({("p", "text::jsonb")})
    )
    assert (sql, names) == ("SELECT $1, $2::text::jsonb, $1::int, $2::text::jsonb", ["a", "p"])


#: The statements the calls that take an application's connection run (enqueue, enqueue_many,
#: admit, refuse, get_action, erase_subject).
APPLICATION_STATEMENTS = (
    "enqueue",
    "action_by_idempotency_key",
    "enqueue_diagnose",
    "enqueue_many",
    "actions_by_idempotency_keys",
    "enqueue_many_diagnose",
    "action_by_id",
    "admit",
    "refuse",
    "erase_subject",
)


async def test_every_statement_an_application_call_runs_prepares_on_asyncpg(
    outbox, database_url, schema
):
    """Numbered, each is a statement PostgreSQL accepts, with every parameter's type inferred."""
    conn = await asyncpg.connect(database_url)
    failed = {}
    statements = queries_for(schema)
    try:
        for name in APPLICATION_STATEMENTS:
            sql = statements[name]
            try:
                prepared = await conn.prepare(numbered(sql)[0])
                assert all(t.name != "unknown" for t in prepared.get_parameters()), name
            except asyncpg.PostgresError as error:
                failed[name] = str(error)
    finally:
        await conn.close()
    assert failed == {}


# -- the built-in kinds' enqueue helpers ride the same connectors --------------------------------


def test_enqueue_webhook_rides_a_psycopg2_transaction(outbox, database_url, schema):
    from outbox.webhook import add_subscription, enqueue_webhook, new_secret

    with psycopg.connect(database_url) as conn:
        add_subscription(conn, "https://hooks.example/in", [new_secret()], ["paid"], schema=schema)
        conn.commit()
    with psycopg2_connection(database_url, commit=False) as conn:
        enqueue_webhook(conn, "paid", {"invoice": 1}, idempotency_key="rolled", schema=schema)
    with psycopg2_connection(database_url, commit=True) as conn:
        (action,) = enqueue_webhook(
            conn, "paid", {"invoice": 2}, idempotency_key="kept", schema=schema
        )
    assert action.kind == "WEBHOOK" and action.payload["data"] == {"invoice": 2}
    assert [r["kind"] for r in _committed(database_url, schema).values()] == ["WEBHOOK"]


async def test_enqueue_webhook_async_rides_an_asyncpg_transaction(outbox, database_url, schema):
    from outbox.webhook import add_subscription, enqueue_webhook_async, new_secret

    with psycopg.connect(database_url) as conn:
        add_subscription(conn, "https://hooks.example/in", [new_secret()], ["paid"], schema=schema)
        conn.commit()
    async with asyncpg_connection(database_url, commit=False) as conn:
        await enqueue_webhook_async(conn, "paid", {"n": 1}, idempotency_key="rolled", schema=schema)
    async with asyncpg_connection(database_url, commit=True) as conn:
        (action,) = await enqueue_webhook_async(
            conn, "paid", {"n": 2}, idempotency_key="kept", schema=schema
        )
    assert action.kind == "WEBHOOK" and action.payload["data"] == {"n": 2}
    assert len(_committed(database_url, schema)) == 1
