"""``BinaryArray``: a list that psycopg sends to PostgreSQL as a binary array.

A group-committed statement (``outbox.batching``) carries its batch as arrays, a dozen of up to
256 elements for a finish. psycopg's ``%s`` sends a list in text: it quotes and escapes each
element (a regular expression an element), which cost the client 0.68-0.83 ms for a finish's
twelve arrays of 100; its binary array dumper took 0.25 ms, and the server then parses no text.
The outbox converts its statements to ``$n`` placeholders itself (``outbox._io``), which psycopg
dumps in its automatic format, the last dumper registered for the value's class: this subclass
of ``list`` is registered with the binary array dumper, so a ``BinaryArray`` goes in binary
wherever psycopg sees it, and a plain list stays as it was.

The registration is on psycopg's global adapters, for this class alone (nothing else of an
application changes): a connection takes a copy of them when it connects, so one made before
this module was imported sends a ``BinaryArray`` as the list it also is, in text.

The group-commit statements wrap their arrays at their call sites (``outbox.store``), and no
other statement's lists are sent this way: turning every list into a ``BinaryArray`` where
statements are sent (``outbox._io.as_sent``) would change what some statements receive (a list
of strings goes in text as an array of unknown, which an uncast ``$1`` returns as one string,
and in binary as ``text[]``), and psycopg's binary dumper refuses a list of lists.
"""

from __future__ import annotations

from typing import TypeVar

import psycopg
from psycopg.types.array import ListBinaryDumper

T = TypeVar("T")


class BinaryArray(list[T]):
    """A list psycopg sends as a binary array (its element type chosen as for a list: the
    widest integer decides an integer array's; all nulls go as an array of unknown, which the
    statement's cast types)."""


psycopg.adapters.register_dumper(BinaryArray, ListBinaryDumper)
