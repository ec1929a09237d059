"""Named ``%(name)s`` placeholders (psycopg's and psycopg2's pyformat, in which ``queries.sql``
is written) as PostgreSQL's own numbered ``$1`` placeholders: what asyncpg speaks, and what a
psycopg raw cursor sends as it is (``outbox._io``), so that psycopg does not parse the named ones
on every call.

The one place the conversion happens: a name used twice gets one number, ``%%`` becomes ``%``
(as psycopg reads it when parameters are given), and nothing else of the text changes.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from functools import cache
from typing import Any

_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%%")


@cache
def numbered(sql: str, casts: frozenset[tuple[str, str]] = frozenset()) -> tuple[str, list[str]]:
    """``sql`` with ``$n`` for each ``%(name)s``, and the names in number order.

    ``casts``: (name, type) pairs; that name's placeholder becomes ``$n::type`` wherever it
    stands (an adapter sends such a value as text and lets the server convert it).
    """
    names: list[str] = []
    numbers: dict[str, int] = {}
    cast_of = dict(casts)

    def replace(match: re.Match[str]) -> str:
        name = match.group(1)
        if name is None:
            return "%"
        if name not in numbers:
            names.append(name)
            numbers[name] = len(names)
        cast = cast_of.get(name)
        return f"${numbers[name]}" + (f"::{cast}" if cast else "")

    return _PLACEHOLDER.sub(replace, sql), names


def positional(names: list[str], params: Mapping[str, Any] | None) -> list[Any]:
    """The values of ``params`` in the order of ``names`` (a missing one raises ``KeyError``
    naming it, as psycopg does)."""
    if not names:
        return []
    if params is None:
        raise KeyError(names[0])
    return [params[name] for name in names]
