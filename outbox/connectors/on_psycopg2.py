"""psycopg2: the same pyformat placeholders as psycopg 3, so the statements run unchanged; only
the values need psycopg2's own wrappers (JSON), and jsonb is read back as JSON on the outbox's
cursor whatever the connection was told (Django reads it as text)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, TypeVar, cast

from psycopg.types.json import Jsonb

from outbox._io import Operation
from outbox.errors import UnusableConnection

T = TypeVar("T")


def json_text(value: Jsonb) -> str:
    """The JSON text of a psycopg ``Jsonb`` value (the statements' JSON parameters)."""
    dumps = value.dumps or json.dumps
    text = dumps(value.obj)
    return text.decode() if isinstance(text, bytes | bytearray | memoryview) else str(text)


def _identity(text: str) -> str:
    return text


def _value(value: Any) -> Any:
    from psycopg2.extras import Json

    if isinstance(value, Jsonb):
        return Json(json_text(value), dumps=_identity)
    if isinstance(value, list) and any(isinstance(v, Jsonb) for v in value):
        return [_value(v) for v in value]
    return value


def _params(params: Mapping[str, Any] | None) -> dict[str, Any] | None:
    return None if params is None else {name: _value(v) for name, v in params.items()}


def run(conn: Any, op: Operation[T], caller: str) -> T:
    """Runs ``op`` on a psycopg2 connection, in its transaction (psycopg2 begins one at the
    first statement unless the caller set autocommit)."""
    from psycopg2.extras import RealDictCursor, register_default_jsonb

    if conn.closed:
        raise UnusableConnection(
            f"{caller} cannot use a closed psycopg2 {type(conn).__name__}: give an open one"
        )
    with conn.cursor(cursor_factory=RealDictCursor) as cur:
        register_default_jsonb(cur, loads=json.loads)
        try:
            statement = next(op)
            while True:
                cur.execute(statement.sql, _params(statement.params))
                fetched = cur.fetchall() if cur.description else []
                rows: list[Any]
                if statement.tuples:
                    rows = [tuple(row.values()) for row in fetched]
                else:
                    rows = [dict(row) for row in fetched]
                statement = op.send(rows)
        except StopIteration as done:
            return cast(T, done.value)
