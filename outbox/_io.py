"""Sync and async twins from one core.

Each database operation is written once, as a generator that yields ``Statement``s and receives
their rows (dicts, or tuples where the statement asks); ``run_sync`` and ``run_async`` drive it
on a psycopg ``Connection`` or ``AsyncConnection``. The operation never sees which one it runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, TypeVar, cast

from psycopg import (
    AsyncConnection,
    AsyncCursor,
    AsyncPipeline,
    AsyncRawCursor,
    Connection,
    Cursor,
    RawCursor,
    pq,
)
from psycopg.rows import dict_row, tuple_row

from outbox.payload_json import read_payloads_fast
from outbox.placeholders import numbered, positional

T = TypeVar("T")
#: A statement's rows: dicts by column name, or tuples in column order (``Statement.tuples``).
Rows = list[Any]


@dataclass(frozen=True, slots=True)
class Statement:
    """``tuples``: the rows come back as tuples in the statement's column order, not dicts (a
    dict a row, and its names read from the result, cost a statement run a million times a
    few microseconds: the single enqueue).

    ``prepare``: prepared at its first run on a connection, not psycopg's sixth (its
    ``prepare_threshold``): a statement every attempt or claim runs, whose plan costs more
    than a run of it (``docs/benchmarks.md``), planned once a connection where the session
    or the transaction asks for generic plans.

    ``rows``: a psycopg row factory that makes each row what its operation reads (a claimed
    action: ``outbox.store``), in place of a dict or a tuple; such a statement's payloads are
    parsed by ``outbox.payload_json``."""

    sql: str
    params: Mapping[str, Any] | None = None
    tuples: bool = False
    prepare: bool = False
    rows: Callable[[Any], Any] | None = None

    @property
    def prepare_argument(self) -> bool | None:
        """psycopg's ``prepare`` for it: True (prepared at its first run), or None (psycopg's
        own choice, at its sixth)."""
        return True if self.prepare else None


Operation = Generator[Statement, Rows, T]


def returned_rows(cur: Any) -> bool:
    """Whether the statement returned rows. Not ``cur.description``: that builds a Column object
    a column on every call, a cost every enqueue would pay for a yes or no (docs/benchmarks.md)."""
    result = cur.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


#: Statements kept converted: every statement of ``queries.sql`` for a few schemas, bounded so
#: that statements built at run time could never grow the cache without end.
_CONVERTED = 4096


@lru_cache(maxsize=_CONVERTED)
def _numbered(sql: str) -> tuple[bytes | str, list[str]]:
    """``numbered``, as bytes when ASCII (as every statement of ``queries.sql`` is): every
    client encoding PostgreSQL speaks writes ASCII the same, and one bytes object, hashed once,
    spares psycopg encoding the text and hashing it for its prepared-statement cache on every
    call."""
    text, names = numbered(sql)
    return (text.encode("ascii") if text.isascii() else text), names


def as_sent(statement: Statement) -> tuple[bytes | str, list[Any] | None]:
    """``statement`` as PostgreSQL's own ``$n`` placeholders and its values in their order.

    Converted once a statement: psycopg would otherwise parse the named placeholders and
    reorder a dict of values on every call; a raw cursor sends the text as it is. Without
    parameters the text is sent unconverted, as psycopg sends it (``%%`` stays)."""
    if statement.params is None:
        return statement.sql, None
    sql, names = _numbered(statement.sql)
    return sql, positional(names, statement.params)


def _row_factory(statement: Statement) -> Any:
    if statement.rows is not None:
        return statement.rows
    return tuple_row if statement.tuples else dict_row


def run_sync(
    conn: Connection[Any], op: Operation[T], prepare: Callable[[Any], None] | None = None
) -> T:
    """Runs ``op`` on ``conn``; ``prepare``, if given, sets up the cursor first (its loaders).

    On a connection that makes psycopg's default cursors (server-side binding) the statements
    go through a raw cursor, converted once (``as_sent``); a connection given another cursor
    class (``ClientCursor``, as Django's makes by default, or the application's own) gets the
    statements on that class, as written: how values are bound stays the caller's choice."""
    raw = conn.cursor_factory is Cursor
    with RawCursor(conn, row_factory=dict_row) if raw else conn.cursor(row_factory=dict_row) as cur:
        if prepare is not None:
            prepare(cur)
        try:
            statement = next(op)
            payloads_fast = False
            while True:
                cur.row_factory = _row_factory(statement)
                if statement.rows is not None and not payloads_fast:
                    read_payloads_fast(cur)
                    payloads_fast = True
                prepare_now = statement.prepare_argument
                if raw:
                    cur.execute(*as_sent(statement), prepare=prepare_now)
                else:
                    cur.execute(statement.sql, statement.params, prepare=prepare_now)
                rows = cur.fetchall() if returned_rows(cur) else []
                statement = op.send(rows)
        except StopIteration as done:
            return cast(T, done.value)


async def run_async(
    conn: AsyncConnection[Any],
    op: Operation[T],
    prepare: Callable[[Any], None] | None = None,
    *,
    started: Rows | None = None,
) -> T:
    """Runs ``op`` on ``conn`` as ``run_sync`` does; ``prepare``, if given, sets up the cursor
    first (its loaders).

    ``started``: ``op`` already yielded its first statement and these are its rows (the caller
    ran it, e.g. in one round trip with statements of its own).
    """
    raw = conn.cursor_factory is AsyncCursor
    async with (
        AsyncRawCursor(conn, row_factory=dict_row) if raw else conn.cursor(row_factory=dict_row)
    ) as cur:
        if prepare is not None:
            prepare(cur)
        try:
            statement = next(op) if started is None else op.send(started)
            payloads_fast = False
            while True:
                cur.row_factory = _row_factory(statement)
                if statement.rows is not None and not payloads_fast:
                    read_payloads_fast(cur)
                    payloads_fast = True
                prepare_now = statement.prepare_argument
                if raw:
                    await cur.execute(*as_sent(statement), prepare=prepare_now)
                else:
                    await cur.execute(statement.sql, statement.params, prepare=prepare_now)
                rows = await cur.fetchall() if returned_rows(cur) else []
                statement = op.send(rows)
        except StopIteration as done:
            return cast(T, done.value)


async def commit_pipelined(
    conn: AsyncConnection[Any], statements: Sequence[Statement], *, begin: bool
) -> list[Rows]:
    """Runs ``statements`` and a COMMIT on ``conn`` (autocommit) in one round trip (psycopg's
    pipeline mode), in the transaction that is open or, with ``begin``, in one it begins
    first; returns each statement's rows, in order. Either way the transaction is over when it
    returns or raises: committed, or rolled back and the first error raised.

    The statements and the COMMIT are two segments of the pipeline, a Sync after each. A
    statement that fails aborts the transaction and the server skips the rest of its segment;
    the COMMIT, in the next one, then ends the aborted transaction (as a ROLLBACK), in the same
    round trip. With one segment the transaction would stay open, aborted and holding its
    locks, until the caller's ROLLBACK came; and psycopg ends a pipeline with a flush request
    after its Sync, which leaves ``idle_in_transaction_session_timeout`` disarmed
    (``outbox.dispatch.claim_guard``), so a process paused or cut off right then would hold
    them for ever.

    A statement goes on a raw cursor, converted once (``as_sent``), on a connection that makes
    psycopg's default cursors, and as written on one given another cursor class (as
    ``run_async``)."""
    cursors: list[AsyncCursor[Any]] = []
    raw = conn.cursor_factory is AsyncCursor
    async with conn.pipeline() as pipeline:
        if begin:
            await conn.execute(b"BEGIN")
        for statement in statements:
            if raw:
                cur: AsyncCursor[Any] = AsyncRawCursor(conn, row_factory=_row_factory(statement))
            else:
                cur = conn.cursor(row_factory=_row_factory(statement))
            if statement.rows is not None:
                read_payloads_fast(cur)
            if raw:
                await cur.execute(*as_sent(statement), prepare=statement.prepare_argument)
            else:
                await cur.execute(
                    statement.sql, statement.params, prepare=statement.prepare_argument
                )
            cursors.append(cur)
        _end_segment(pipeline)
        await conn.execute(b"COMMIT")
    answers = []
    for cur in cursors:
        answers.append(await cur.fetchall() if returned_rows(cur) else [])
        await cur.close()
    return answers


def _end_segment(pipeline: AsyncPipeline) -> None:
    """Queues a Sync in ``pipeline`` without waiting for the server's answer: psycopg's public
    ``sync()`` waits for it (a round trip of its own), and there is no other call for it."""
    pipeline._enqueue_sync()


def _is_async(conn: Any) -> bool:
    """A psycopg ``AsyncConnection``, or anything of SQLAlchemy's asyncio extension (its
    ``AsyncSession``, ``AsyncConnection``, ``async_scoped_session``), told apart by module so
    that SQLAlchemy need not be imported."""
    return isinstance(conn, AsyncConnection) or type(conn).__module__.startswith(
        "sqlalchemy.ext.asyncio"
    )


def psycopg_connection(conn: Any, caller: str, async_twin: str | None = None) -> Connection[Any]:
    """The psycopg connection under ``conn``: itself, or a SQLAlchemy Session's or Connection's.

    SQLAlchemy's connection is taken on the session's own transaction (``Session.connection()``
    begins it if needed), so the enqueue commits or rolls back with the application's work.
    ``caller`` is the sync function given ``conn``; an async connection raises ``TypeError``
    naming ``async_twin``, the function to call with it instead.
    """
    if isinstance(conn, Connection):
        return conn
    if _is_async(conn):
        instead = f"call {async_twin} with it, or give {caller}" if async_twin else "give it"
        raise TypeError(
            f"{caller} runs on a sync connection but got an async {type(conn).__name__}: "
            f"{instead} a psycopg Connection or a SQLAlchemy Session/Connection"
        )
    session_connection = getattr(conn, "connection", None)
    if callable(session_connection):  # a SQLAlchemy Session: .connection() -> Connection
        conn = session_connection()
    in_transaction = getattr(conn, "in_transaction", None)
    if callable(in_transaction) and not in_transaction():
        # SQLAlchemy autobegins only for its own statements: begin here, so that the
        # Connection's commit() or rollback() covers the enqueue.
        conn.begin()
    dbapi = getattr(conn, "connection", None)  # SQLAlchemy Connection -> pool proxy
    driver = getattr(dbapi, "driver_connection", None)
    if isinstance(driver, Connection):
        return driver
    raise TypeError(
        f"expected a psycopg Connection or a SQLAlchemy Session/Connection on the psycopg driver, "
        f"got {type(conn).__name__}"
    )
