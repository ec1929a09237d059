"""asyncpg: numbered ``$n`` placeholders (``placeholders.numbered`` converts), positional values,
and codecs the caller may have changed on its connection.

JSON goes to the server as text with a cast (``$n::text::jsonb``), so whatever jsonb codec the
connection has (asyncpg's text one, SQLAlchemy's binary one, the application's own) never sees
an outbox value. jsonb comes back through the connection's codec: JSON text from asyncpg's
default one, which is decoded here, or values a decoding codec made (``json_decoded``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from psycopg.types.json import Jsonb

from outbox._io import Operation
from outbox.connectors.on_psycopg2 import json_text
from outbox.errors import UnusableConnection
from outbox.placeholders import numbered, positional

T = TypeVar("T")

_JSON_TYPES = frozenset({"json", "jsonb"})


def _casts(params: Mapping[str, Any]) -> frozenset[tuple[str, str]]:
    casts = set()
    for name, value in params.items():
        if isinstance(value, Jsonb):
            casts.add((name, "text::jsonb"))
        elif isinstance(value, list) and any(isinstance(v, Jsonb) for v in value):
            casts.add((name, "text[]::jsonb[]"))
    return frozenset(casts)


def _value(value: Any) -> Any:
    if isinstance(value, Jsonb):
        return json_text(value)
    if isinstance(value, list) and any(isinstance(v, Jsonb) for v in value):
        return [_value(v) for v in value]
    return value


def check_usable(conn: Any, caller: str) -> None:
    if conn.is_closed():
        raise UnusableConnection(
            f"{caller} cannot use a closed asyncpg {type(conn).__name__}: give an open one"
        )
    if not conn.is_in_transaction():
        # asyncpg commits every statement on its own outside a transaction: the action would
        # be committed whether or not the application's own work is.
        raise UnusableConnection(
            f"{caller} needs a transaction on the asyncpg {type(conn).__name__}: call it inside "
            "`async with conn.transaction():`"
        )


async def run(conn: Any, op: Operation[T], caller: str, *, json_decoded: bool = False) -> T:
    """Runs ``op`` on an asyncpg connection inside its transaction. ``json_decoded``: the
    connection's jsonb codec already decodes (SQLAlchemy's does)."""
    check_usable(conn, caller)
    try:
        statement = next(op)
        while True:
            params = statement.params or {}
            sql, names = (
                numbered(statement.sql, _casts(params))
                if statement.params is not None
                else (statement.sql, [])
            )
            prepared = await conn.prepare(sql)
            records = await prepared.fetch(*[_value(v) for v in positional(names, params)])
            decode = (
                []
                if json_decoded
                else [a.name for a in prepared.get_attributes() if a.type.name in _JSON_TYPES]
            )
            rows = []
            for record in records:
                row = dict(record.items())
                for column in decode:
                    if isinstance(row[column], str):
                        row[column] = json.loads(row[column])
                rows.append(tuple(row.values()) if statement.tuples else row)
            statement = op.send(rows)
    except StopIteration as done:
        return cast(T, done.value)
