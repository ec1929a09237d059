"""psycopg 3: the native driver. Statements run as they are written, on a cursor of the
caller's connection, in its transaction (or in autocommit, when the caller chose that)."""

from __future__ import annotations

from typing import Any, TypeVar

from psycopg import AsyncConnection, Connection
from psycopg.types.json import JsonbBinaryLoader, JsonbLoader

from outbox._io import Operation, run_async, run_sync
from outbox.errors import UnusableConnection

T = TypeVar("T")


def _json_loaders(cursor: Any) -> None:
    """jsonb read as Python values on this cursor only: Django's connection reads it as text
    (its JSONField decodes), and the outbox's rows need the payload decoded."""
    cursor.adapters.register_loader("jsonb", JsonbLoader)
    cursor.adapters.register_loader("jsonb", JsonbBinaryLoader)


def _check_open(conn: Connection[Any] | AsyncConnection[Any], caller: str) -> None:
    if conn.closed:
        raise UnusableConnection(
            f"{caller} cannot use a closed psycopg {type(conn).__name__}: give an open one"
        )


def run(conn: Connection[Any], op: Operation[T], caller: str, *, text_json: bool = False) -> T:
    """``text_json``: the connection reads jsonb as text (Django's); the outbox's cursor reads
    it as JSON."""
    _check_open(conn, caller)
    return run_sync(conn, op, _json_loaders if text_json else None)


async def run_on_async(conn: AsyncConnection[Any], op: Operation[T], caller: str) -> T:
    _check_open(conn, caller)
    return await run_async(conn, op)
