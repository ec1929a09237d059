"""A group-committed statement's arrays go to PostgreSQL in binary (``BinaryArray``): whatever
an adapter's reference or reason holds arrives as it was, and a plain list stays in text."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import psycopg
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import RawCursor, pq
from psycopg.adapt import PyFormat, Transformer

from outbox.binary_arrays import BinaryArray

#: Text as a provider's reference or an error's class name could hold it: quotes, backslashes,
#: braces, commas, the word NULL, any code point PostgreSQL stores (not NUL).
TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=40)


def test_a_binary_array_is_dumped_in_binary_and_a_list_in_text(database_url: str) -> None:
    with psycopg.connect(database_url) as conn:
        tx = Transformer(conn)
        binary = tx.get_dumper(BinaryArray(["a", None]), PyFormat.AUTO)
        text = tx.get_dumper(["a", None], PyFormat.AUTO)
    assert binary.format == pq.Format.BINARY
    assert text.format == pq.Format.TEXT


@settings(max_examples=60, deadline=None)
@given(texts=st.lists(st.one_of(st.none(), TEXT), max_size=30))
def test_text_arrives_as_it_was_sent(database_url: str, texts: list[str | None]) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = RawCursor(conn)
        cur.execute("SELECT (SELECT $1::text[])", [BinaryArray(texts)])
        row = cur.fetchone()
    assert row is not None and row[0] == texts


def test_every_column_type_of_a_finish_arrives_as_it_was_sent(database_url: str) -> None:
    now = datetime.now(UTC)
    columns = {
        "bigint": [1, 2**40, 5],  # the widest element decides the element type
        "interval": [timedelta(seconds=1.5), None, timedelta(0)],
        "timestamptz": [now, None, now],
        "boolean": [True, False, None],
        "text": [None, None, None],  # all nulls: an array of unknown, typed by the cast
    }
    sql = "SELECT " + ", ".join(
        f"(SELECT ${i}::{name}[])" for i, name in enumerate(columns, start=1)
    )
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = RawCursor(conn)
        cur.execute(sql, [BinaryArray(values) for values in columns.values()])
        row = cur.fetchone()
    assert row is not None and list(row) == list(columns.values())
