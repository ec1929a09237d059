"""The payloads a claim, a take and a hand-off read come through ``outbox.payload_json``: the
standard library's scanner called directly, which reads every ``jsonb`` PostgreSQL returns as
``json.loads`` would (the same types too: an integer stays an integer however long), and is
used for those statements alone."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from psycopg import RawCursor

from outbox import ActionKind, ActionRequest, enqueue
from outbox.payload_json import loads, read_payloads_fast

NOTE = ActionKind("NOTE")

#: What a payload may hold: every JSON type, integers far beyond 64 bits, floats of every size
#: (no NaN or infinity: JSON has none), text with escapes and any code point PostgreSQL stores.
TEXT = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=20)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(TEXT, inner, max_size=5)),
    max_leaves=25,
)


def typed(value: Any) -> str:
    """``value`` with its types spelled out: 1 and 1.0 differ, as True and 1 do."""
    return json.dumps(value, sort_keys=True)


@settings(max_examples=150, deadline=None)
@given(value=VALUES)
def test_a_jsonb_value_reads_back_as_json_loads_reads_it(database_url: str, value: Any) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        cur = RawCursor(conn)
        (text,) = cur.execute("SELECT $1::text::jsonb::text", [json.dumps(value)]).fetchone()
        read_payloads_fast(cur)
        (fast,) = cur.execute("SELECT $1::text::jsonb", [json.dumps(value)]).fetchone()
    assert typed(fast) == typed(json.loads(text))


@pytest.mark.parametrize(
    "text",
    [
        b"123456789012345678901234567890",
        b'{"big": -98765432109876543210, "f": 1.5e300}',
        b' {"padded": true} ',
        b'"\\ud83d\\ude00 \\u00e9"',
        b"[" * 50 + b"]" * 50,
    ],
)
def test_any_text_reads_as_json_loads_reads_it(text: bytes) -> None:
    assert typed(loads(text)) == typed(json.loads(text))
    assert typed(loads(memoryview(text))) == typed(json.loads(text))


@pytest.mark.parametrize("text", [b"", b"[1, 2", b"nul", b'{"a": 1} {"b": 2}'])
def test_a_broken_text_raises_as_json_loads_raises(text: bytes) -> None:
    with pytest.raises(json.JSONDecodeError) as ours:
        loads(text)
    with pytest.raises(json.JSONDecodeError) as theirs:
        json.loads(text)
    assert str(ours.value) == str(theirs.value)


def test_a_claim_reads_its_payloads_with_it_and_an_application_connection_does_not(
    make_outbox, conn, schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import outbox.payload_json as payload_json

    parsed: list[Any] = []

    def counted(data: Any) -> Any:
        parsed.append(loads(data))
        return parsed[-1]

    monkeypatch.setattr(payload_json, "loads", counted)
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    payloads = [{"i": i, "big": 10**30 + i} for i in range(3)]
    for i, payload in enumerate(payloads):
        enqueue(
            conn,
            ActionRequest(
                kind=NOTE,
                lane_key=f"l{i}",
                idempotency_key=f"k{i}",
                workspace_id="w",
                payload=payload,
            ),
            schema=schema,
        )
    conn.commit()
    assert conn.execute(f'SELECT payload FROM "{schema}".agent_action LIMIT 1').fetchone()
    assert parsed == []  # the application's connection: psycopg's own loader

    async def claim() -> list[Any]:
        async with ob.store() as store:
            claimed = await store.claim({NOTE.name: 10}, timedelta(seconds=30))
            return [c.action.payload for c in claimed]

    read = asyncio.run(claim())
    assert sorted(read, key=lambda p: p["i"]) == payloads
    assert sorted(parsed, key=lambda p: p["i"]) == payloads
