"""SQLAlchemy: the DB-API connection under a ``Session``/``Connection`` (sync) or an
``AsyncSession``/``AsyncConnection`` (asyncio), taken on the caller's own transaction, so that
its ``commit()`` or ``rollback()`` covers the outbox's statements too. SQLAlchemy is never
imported here: the objects are only asked for what they offer."""

from __future__ import annotations

from typing import Any


def is_sqlalchemy(conn: Any) -> bool:
    return type(conn).__module__.startswith("sqlalchemy.")


def is_sqlalchemy_async(conn: Any) -> bool:
    return type(conn).__module__.startswith("sqlalchemy.ext.asyncio")


def driver_connection(conn: Any) -> Any:
    """The driver's connection under a sync Session (or scoped_session) or Connection."""
    session_connection = getattr(conn, "connection", None)
    if callable(session_connection):  # a Session: .connection() -> Connection, begun
        conn = session_connection()
    in_transaction = getattr(conn, "in_transaction", None)
    if callable(in_transaction) and not in_transaction():
        # SQLAlchemy autobegins only for its own statements: begin here, so that the
        # Connection's commit() or rollback() covers the outbox's statements.
        conn.begin()
    return getattr(getattr(conn, "connection", None), "driver_connection", None)


async def async_driver_connection(conn: Any) -> Any:
    """The driver's connection under an AsyncSession (or async_scoped_session) or
    AsyncConnection, inside the transaction SQLAlchemy began on it."""
    if not hasattr(conn, "get_raw_connection"):  # a session: its connection, begun
        conn = await conn.connection()
    if not conn.in_transaction():
        await conn.begin()
    raw = await conn.get_raw_connection()
    driver = raw.driver_connection
    if type(driver).__module__.startswith("asyncpg") and not driver.is_in_transaction():
        # SQLAlchemy's asyncpg adapter sends BEGIN with its first statement, not at begin():
        # one statement of its own makes it open the transaction the outbox then joins (in
        # autocommit isolation it opens none, and the outbox refuses the connection).
        await conn.exec_driver_sql("SELECT 1")
    return driver
