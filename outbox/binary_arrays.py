"""Arrays that psycopg sends to PostgreSQL in binary, each as one fixed array type.

A group-committed statement (``outbox.batching``) carries its batch as arrays, a dozen of up to
256 elements for a finish. psycopg's ``%s`` sends a list in text: it quotes and escapes each
element (a regular expression an element), which cost the client 0.68-0.83 ms for a finish's
twelve arrays of 100; its binary array dumper took 0.25 ms, and the server then parses no text.
The outbox converts its statements to ``$n`` placeholders itself (``outbox._io``), which psycopg
dumps in its automatic format, the last dumper registered for the value's class: each subclass
of ``list`` here is registered with a binary array dumper of its own type, so it goes in binary
wherever psycopg sees it, and a plain list stays as it was. The most common arrays of a batch
are made at once (``_FixedArrayDumper``).

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

import struct
from typing import Any

import psycopg
from psycopg import postgres
from psycopg.abc import Buffer
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


#: PostgreSQL's binary array (one dimension): dimensions, whether any element is null, the
#: element type, the length and the lower bound; then each element's length (-1: null) and
#: bytes.
_HEAD = struct.Struct(">iiIii").pack
_NULL = b"\xff\xff\xff\xff"
_INT8 = struct.Struct(">iq").pack
_TRUE = b"\x00\x00\x00\x01\x01"
_FALSE = b"\x00\x00\x00\x01\x00"


class _FixedArrayDumper(ListBinaryDumper):
    """psycopg's binary array dumper of one fixed type, with the arrays a batch sends most made
    at once: all nulls (a finish's reasons, references and hand-offs, a fence's references),
    and the ids, epochs and flags, one ``struct`` call an element. psycopg's own loop calls an
    element's dumper and packs its length, an element at a time: 100 nulls took 7.1 us
    against 0.5, 100 ids 25.6 against 14.8, 100 flags 26.7 against 6.0 (a finish sends
    thirteen arrays, four to six of them nulls: about 1.2 us an action less). Text, times and
    intervals go through psycopg's C dumpers, which beat the same written here. The bytes are
    psycopg's (a test compares them)."""

    def dump(self, obj: list[Any]) -> Buffer | None:
        length = len(obj)
        if length and obj.count(None) == length:
            return _HEAD(1, 1, self.element_oid, length, 1) + _NULL * length
        return super().dump(obj)


class _Int8ArrayDumper(_FixedArrayDumper):
    def dump(self, obj: list[Any]) -> Buffer | None:
        if not obj or None in obj:
            return super().dump(obj)
        try:
            elements = b"".join([_INT8(8, value) for value in obj])
        except struct.error as error:
            raise psycopg.DataError(f"bigint[] element out of range: {error}") from None
        return _HEAD(1, 0, self.element_oid, len(obj), 1) + elements


class _BoolArrayDumper(_FixedArrayDumper):
    def dump(self, obj: list[Any]) -> Buffer | None:
        if not obj or None in obj:
            return super().dump(obj)
        elements = b"".join([_TRUE if value else _FALSE for value in obj])
        return _HEAD(1, 0, self.element_oid, len(obj), 1) + elements


def _fixed_dumper(base: type[_FixedArrayDumper], element: str) -> type[_FixedArrayDumper]:
    """A binary array dumper (``base``) that always sends ``element[]``, whatever the list
    holds."""
    info = postgres.types.get(element)
    assert info is not None, element
    array_type, element_type = info.array_oid, info.oid

    class FixedArrayDumper(base):  # type: ignore[valid-type,misc]
        # Both oids set on the class, as psycopg's own ``register_array`` sets them: its
        # elements go through the binary dumper of ``element``, and psycopg neither looks at
        # them for a type (``get_key``) nor picks another dumper (``upgrade``).
        oid = array_type
        element_oid = element_type

    FixedArrayDumper.__name__ = f"{element.title()}ArrayBinaryDumper"
    dumper: type[_FixedArrayDumper] = FixedArrayDumper
    return dumper


for _cls, _base, _element in (
    (Int8Array, _Int8ArrayDumper, "int8"),
    (TextArray, _FixedArrayDumper, "text"),
    (IntervalArray, _FixedArrayDumper, "interval"),
    (TimestamptzArray, _FixedArrayDumper, "timestamptz"),
    (BoolArray, _BoolArrayDumper, "bool"),
):
    psycopg.adapters.register_dumper(_cls, _fixed_dumper(_base, _element))
