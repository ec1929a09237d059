"""Sync and async twins from one core.

Each database operation is written once, as a generator that yields ``Statement``s and receives
their rows (dicts); ``run_sync`` and ``run_async`` drive it on a psycopg ``Connection`` or
``AsyncConnection``. The operation never sees which one it runs on.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar, cast

from psycopg import AsyncConnection, Connection, pq
from psycopg.rows import dict_row

T = TypeVar("T")
Rows = list[dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Statement:
    sql: str
    params: Mapping[str, Any] | None = None


Operation = Generator[Statement, Rows, T]


def returned_rows(cur: Any) -> bool:
    """Whether the statement returned rows. Not ``cur.description``: that builds a Column object
    a column on every call, a cost every enqueue would pay for a yes or no (docs/benchmarks.md)."""
    result = cur.pgresult
    return result is not None and result.status == pq.ExecStatus.TUPLES_OK


def run_sync(
    conn: Connection[Any], op: Operation[T], prepare: Callable[[Any], None] | None = None
) -> T:
    """Runs ``op`` on ``conn``; ``prepare``, if given, sets up the cursor first (its loaders)."""
    with conn.cursor(row_factory=dict_row) as cur:
        if prepare is not None:
            prepare(cur)
        try:
            statement = next(op)
            while True:
                cur.execute(statement.sql, statement.params)
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
    """Runs ``op`` on ``conn``; ``prepare``, if given, sets up the cursor first (its loaders).

    ``started``: ``op`` already yielded its first statement and these are its rows (the caller
    ran it, e.g. in one round trip with statements of its own).
    """
    async with conn.cursor(row_factory=dict_row) as cur:
        if prepare is not None:
            prepare(cur)
        try:
            statement = next(op) if started is None else op.send(started)
            while True:
                await cur.execute(statement.sql, statement.params)
                rows = await cur.fetchall() if returned_rows(cur) else []
                statement = op.send(rows)
        except StopIteration as done:
            return cast(T, done.value)


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
