"""A group-committed statement's arrays go to PostgreSQL in binary, each as one fixed array type
(``outbox.binary_arrays``): whatever an adapter's reference or reason holds arrives as it was, a
plain list stays in text, and an array's type is its class's whatever it holds, so that a
statement is prepared once a connection."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import RawCursor, pq
from psycopg.adapt import PyFormat, Transformer
from psycopg.types.array import ListBinaryDumper

from outbox.binary_arrays import (
    BoolArray,
    Int8,
    Int8Array,
    IntervalArray,
    TextArray,
    TimestamptzArray,
)

#: Text as a provider's reference or an error's class name could hold it: quotes, backslashes,
#: braces, commas, the word NULL, any code point PostgreSQL stores (not NUL).
TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=40)
NOW = datetime.now(UTC)
#: Each array class, its type's name, and what it may hold.
ARRAYS: dict[type[list[Any]], tuple[str, st.SearchStrategy[Any]]] = {
    Int8Array: ("bigint", st.integers(min_value=-(2**63), max_value=2**63 - 1)),
    TextArray: ("text", st.one_of(st.none(), TEXT)),
    IntervalArray: (
        "interval",
        st.one_of(st.none(), st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=9))),
    ),
    TimestamptzArray: ("timestamptz", st.one_of(st.none(), st.just(NOW))),
    BoolArray: ("boolean", st.one_of(st.none(), st.booleans())),
}


def test_a_typed_array_is_dumped_in_binary_and_a_list_in_text(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        tx = Transformer(conn)
        binary = tx.get_dumper(TextArray(["a", None]), PyFormat.AUTO)
        text = tx.get_dumper(["a", None], PyFormat.AUTO)
    assert binary.format == pq.Format.BINARY
    assert text.format == pq.Format.TEXT


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.one_of(st.none(), TEXT), max_size=30))
def test_text_arrives_as_it_was_sent(database_url: str, texts: list[str | None]) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = RawCursor(conn)
        cur.execute("SELECT (SELECT $1::text[])", [TextArray(texts)])
        row = cur.fetchone()
    assert row is not None and row[0] == texts


def test_every_column_type_of_a_finish_arrives_as_it_was_sent(database_url: str) -> None:
    columns: dict[str, list[Any]] = {
        "bigint": [1, 2**40, 5],
        "interval": [timedelta(seconds=1.5), None, timedelta(0)],
        "timestamptz": [NOW, None, NOW],
        "boolean": [True, False, None],
        "text": [None, None, None],
    }
    classes = [Int8Array, IntervalArray, TimestamptzArray, BoolArray, TextArray]
    sql = "SELECT " + ", ".join(
        f"(SELECT ${i}::{name}[])" for i, name in enumerate(columns, start=1)
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = RawCursor(conn)
        cur.execute(
            sql, [cls(values) for cls, values in zip(classes, columns.values(), strict=True)]
        )
        row = cur.fetchone()
    assert row is not None and list(row) == list(columns.values())


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_an_arrays_type_is_its_classs_whatever_it_holds(database_url: str, data: Any) -> None:
    """Empty, all nulls, small or huge integers: one type for each class, so psycopg keys one
    prepared statement for every batch (its cache is by text and parameter types)."""
    with psycopg.connect(database_url, autocommit=True) as conn:
        tx = Transformer(conn)
        for cls, (name, elements) in ARRAYS.items():
            values = data.draw(st.lists(elements, max_size=5))
            dumper = tx.get_dumper(cls(values), PyFormat.AUTO).upgrade(cls(values), PyFormat.AUTO)
            (oid,) = conn.execute("SELECT %s::regtype::oid", (f"{name}[]",)).fetchone() or (0,)
            assert dumper.oid == oid, (cls, values)
            cur = RawCursor(conn)
            cur.execute(f"SELECT (SELECT $1::{name}[])", [cls(values)])
            row = cur.fetchone()
            assert row is not None and row[0] == values


#: Wider than what a batch holds: any aware time (before 2000 too, in any zone), any interval.
WIDER: dict[type[list[Any]], st.SearchStrategy[Any]] = {
    Int8Array: ARRAYS[Int8Array][1],
    TextArray: ARRAYS[TextArray][1],
    IntervalArray: st.one_of(st.none(), st.timedeltas()),
    TimestamptzArray: st.one_of(
        st.none(),
        st.datetimes(
            min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=st.timezones()
        ),
    ),
    BoolArray: ARRAYS[BoolArray][1],
}


def psycopgs_own(cls: type[list[Any]], conn: psycopg.Connection[Any]) -> Any:
    """psycopg's binary array dumper for ``cls``'s array type, its elements through psycopg's
    own binary dumpers: the bytes the outbox's dumpers must make."""
    name = ARRAYS[cls][0]
    info = psycopg.postgres.types.get(name)
    assert info is not None

    class Reference(ListBinaryDumper):
        oid = info.array_oid
        element_oid = info.oid

    return Reference(list, conn)


@settings(max_examples=80, deadline=None)
@given(data=st.data())
def test_an_arrays_bytes_are_psycopgs_own(database_url: str, data: Any) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        tx = Transformer(conn)
        for cls, elements in WIDER.items():
            values = cls(data.draw(st.lists(elements, max_size=8)))
            ours = tx.get_dumper(values, PyFormat.AUTO).dump(values)
            theirs = psycopgs_own(cls, conn).dump(list(values))
            assert bytes(ours) == bytes(theirs), (cls, values)


def test_an_integer_beyond_bigint_is_refused(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        dumper = Transformer(conn).get_dumper(Int8Array([2**63]), PyFormat.AUTO)
        with pytest.raises(psycopg.DataError):
            dumper.dump(Int8Array([1, 2**63]))


def test_text_goes_in_the_connections_encoding(database_url: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SET client_encoding TO 'LATIN1'")
        cur = RawCursor(conn)
        cur.execute("SELECT (SELECT $1::text[])", [TextArray(["café", None])])
        row = cur.fetchone()
    assert row is not None and row[0] == ["café", None]


def test_a_statement_of_any_batch_is_one_prepared_statement(database_url: str) -> None:
    sql = "SELECT $1::bigint, (SELECT $2::bigint[]), (SELECT $3::text[])"
    runs = [
        (Int8(0), Int8Array([]), TextArray([])),
        (Int8(7), Int8Array([1, 2]), TextArray([None])),
        (Int8(2**40), Int8Array([2**40]), TextArray(["x", None])),
    ]
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = RawCursor(conn)
        for params in runs:
            cur.execute(sql, params, prepare=True)
        (prepared,) = conn.execute(
            "SELECT count(*) FROM pg_prepared_statements WHERE statement = %s", (sql,)
        ).fetchone() or (0,)
    assert prepared == 1
