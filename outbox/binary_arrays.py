"""Arrays that psycopg sends to PostgreSQL in binary, each as one fixed array type.

A group-committed statement (``outbox.batching``) carries its batch as arrays, a dozen of up to
256 elements for a finish. psycopg's ``%s`` sends a list in text: it quotes and escapes each
element (a regular expression an element), which cost the client 0.68-0.83 ms for a finish's
twelve arrays of 100; its binary array dumper took 0.25 ms, and the server then parses no text.
The outbox converts its statements to ``$n`` placeholders itself (``outbox._io``), which psycopg
dumps in its automatic format, the last dumper registered for the value's class: each subclass
of ``list`` here is registered with a binary array dumper of its own type, so it goes in binary
wherever psycopg sees it, and a plain list stays as it was.

The type is the class's, never the elements': psycopg's own list dumper picks an array's type
from what it holds (``smallint[]`` for small ids, ``bigint[]`` for large ones, an array of
``unknown`` in text when every element is null or there is none), and psycopg keeps a prepared
statement for each set of parameter types it sent. One statement then became several on a
connection, each prepared and planned at its first run, and the warm-up's run (an empty batch)
prepared none the attempts would use. With the type fixed, a statement has one set of parameter
types whatever its batch holds: one prepared statement a connection, made by the warm-up
(``outbox.warmup``). ``Int8`` does the same for a single id or epoch.

The registration is on psycopg's global adapters, for these classes alone (nothing else of an
application changes): a connection takes a copy of them when it connects, so one made before
this module was imported sends these arrays as the lists they also are, in text.

The group-commit statements wrap their arrays at their call sites (``outbox.store``), and no
other statement's lists are sent this way: turning every list into a binary array where
statements are sent (``outbox._io.as_sent``) would change what some statements receive (a list
of strings goes in text as an array of unknown, which an uncast ``$1`` returns as one string,
and in binary as ``text[]``), and a binary array dumper refuses a list of lists.
"""

from __future__ import annotations

from typing import Any

import psycopg
from psycopg import postgres
from psycopg.types.array import ListBinaryDumper
from psycopg.types.numeric import Int8

__all__ = [
    "BoolArray",
    "Int8",
    "Int8Array",
    "IntervalArray",
    "TextArray",
    "TimestamptzArray",
]


class Int8Array(list[int]):
    """A ``bigint[]``: ids and epochs."""


class TextArray(list[Any]):
    """A ``text[]`` of strings and nulls."""


class IntervalArray(list[Any]):
    """An ``interval[]`` of ``timedelta``s and nulls."""


class TimestamptzArray(list[Any]):
    """A ``timestamptz[]`` of aware ``datetime``s and nulls."""


class BoolArray(list[Any]):
    """A ``boolean[]`` of bools and nulls."""


def _fixed_dumper(element: str) -> type[ListBinaryDumper]:
    """A binary array dumper that always sends ``element[]``, whatever the list holds."""
    info = postgres.types.get(element)
    assert info is not None, element
    array_type, element_type = info.array_oid, info.oid

    class FixedArrayDumper(ListBinaryDumper):
        # Both oids set on the class, as psycopg's own ``register_array`` sets them: its
        # elements go through the binary dumper of ``element``, and psycopg neither looks at
        # them for a type (``get_key``) nor picks another dumper (``upgrade``).
        oid = array_type
        element_oid = element_type

    FixedArrayDumper.__name__ = f"{element.title()}ArrayBinaryDumper"
    return FixedArrayDumper


for _cls, _element in (
    (Int8Array, "int8"),
    (TextArray, "text"),
    (IntervalArray, "interval"),
    (TimestamptzArray, "timestamptz"),
    (BoolArray, "bool"),
):
    psycopg.adapters.register_dumper(_cls, _fixed_dumper(_element))
