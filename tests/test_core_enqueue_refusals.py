"""Bad input is a clear refusal: whatever a field holds, ``enqueue`` and ``enqueue_many`` (sync and
async) either write the action so that it reads back equal, or raise ``InvalidActionRequest``
naming the field (and, in a batch, the request's index) having written nothing. In both cases the
caller's transaction goes on: it runs a statement, enqueues again and commits.

Checked against the real PostgreSQL with hostile values for every field: NUL, lone surrogates,
control characters, line separators, text past the index limit, numbers past 32 bits, booleans
where integers go, NaN and infinity, tuples and non-string keys in payloads, huge payloads.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime, timedelta, timezone
from enum import IntEnum, StrEnum
from typing import Any
from unittest import mock

import psycopg
import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from outbox import (
    ActionKind,
    ActionRequest,
    InvalidActionRequest,
    Outbox,
    Settings,
    enqueue,
    enqueue_async,
    enqueue_many,
    enqueue_many_async,
    get_action,
    request_checks,
)
from outbox.errors import ConfigurationError
from outbox.request_checks import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_ATTEMPTS,
    MAX_KEY_BYTES,
    checked_payload,
)
from tests.support import rows

NOTE = ActionKind("NOTE")

# -- hostile values -----------------------------------------------------------------------------

#: Characters PostgreSQL, JSON or the email package treat specially: NUL, lone surrogates, C0 and
#: C1 controls, line and paragraph separators, a BOM, multi-byte and astral characters, a
#: backslash (which JSON escapes, and with "u0000" spells an escaped NUL).
SPECIAL = [
    "\x00",
    "\ud800",
    "\udfff",
    "\x0b",
    "\x0c",
    "\x1c",
    "\x7f",
    "\x85",
    "\u2028",
    "\u2029",
    "\ufeff",
    "\t",
    "\n",
    "\r",
    " ",
    "\\",
    "\\u0000",
    "é",
    "日本",
    "😀",
]

hostile_chars = st.one_of(
    st.sampled_from(SPECIAL),
    st.characters(codec=None, exclude_categories=()),  # any code point, surrogates included
    st.characters(min_codepoint=0x21, max_codepoint=0x7E),
)

#: Text near the byte limit: ASCII and two-byte characters either side of ``MAX_KEY_BYTES``.
long_text = st.builds(
    lambda char, n: char * n,
    st.sampled_from(["k", "é", "😀"]),
    st.sampled_from(
        [
            *(MAX_KEY_BYTES // 4, MAX_KEY_BYTES // 2, MAX_KEY_BYTES // 2 + 1, MAX_KEY_BYTES),
            *(MAX_KEY_BYTES + 1, 3000, 10_000),
        ]
    ),
)

hostile_text = st.one_of(
    st.lists(hostile_chars, max_size=12).map("".join),
    long_text,
    st.builds(lambda a, b: f"key-{a}{b}", st.sampled_from(SPECIAL), st.integers(0, 9)),
)

hostile_numbers = st.one_of(
    st.integers(),
    st.sampled_from([0, -1, 1, 5, MAX_ATTEMPTS, MAX_ATTEMPTS + 1, 2**31, 2**40, 2**63, -(2**63)]),
    # Past Python's int-to-text digit limit (built lazily: such an int has no repr).
    st.builds(lambda sign, digits: sign * 10**digits, st.sampled_from([1, -1]), st.just(4400)),
    st.booleans(),
    st.floats(allow_nan=True, allow_infinity=True),
)

json_leaves = st.one_of(st.none(), hostile_numbers, hostile_text)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.dictionaries(hostile_text, children, max_size=4),
        st.dictionaries(st.one_of(st.integers(), st.booleans()), children, min_size=1, max_size=2),
        st.lists(children, max_size=3).map(tuple),
    )


hostile_payloads = st.one_of(
    st.recursive(json_leaves, _containers, max_leaves=12),
    st.builds(
        lambda n: {"blob": "x" * n},
        st.sampled_from([DEFAULT_MAX_PAYLOAD_BYTES - 20, DEFAULT_MAX_PAYLOAD_BYTES, 200_000]),
    ),
    st.sampled_from([{"when": datetime.now(UTC)}, {"n": {1, 2}}, {"deep": [[[[[[]]]]]]}]),
)

DAY_LESS_A_MINUTE = timedelta(hours=23, minutes=59)

#: Any instant Python has, past or future, in any fixed offset, or naive.
hostile_datetimes = st.datetimes(
    timezones=st.one_of(
        st.none(),
        st.builds(
            timezone,
            st.timedeltas(-timedelta(hours=23, minutes=59), timedelta(hours=23, minutes=59)),
        ),
    )
)

#: One field made hostile, the others valid.
hostile_fields = st.one_of(
    st.tuples(st.just("kind"), st.one_of(hostile_text, st.sampled_from(["NOTE", "NOT_DECLARED"]))),
    st.tuples(st.just("lane_key"), hostile_text),
    st.tuples(st.just("idempotency_key"), hostile_text),
    st.tuples(st.just("workspace_id"), st.one_of(hostile_text, hostile_numbers, st.none())),
    st.tuples(st.just("subject_account_id"), st.one_of(hostile_text, hostile_numbers)),
    st.tuples(st.just("max_attempts"), hostile_numbers),
    st.tuples(st.just("payload"), hostile_payloads),
    st.tuples(st.just("expires_at"), st.one_of(st.none(), hostile_datetimes)),
)


def request(key: str, **fields: Any) -> ActionRequest:
    values: dict[str, Any] = {
        "kind": NOTE,
        "lane_key": "lane",
        "idempotency_key": key,
        "workspace_id": "w1",
        "payload": {"n": 1},
    }
    values.update(fields)
    return ActionRequest(**values)


def same_json(stored: Any, given: Any) -> bool:
    """Whether ``stored`` (read back from jsonb) is ``given``: a float may come back as the
    integer PostgreSQL's numeric prints for it (1e+300 reads back as 10**300)."""
    if isinstance(given, float):
        return (
            isinstance(stored, int | float)
            and not isinstance(stored, bool)
            and (float(stored) == given)
        )
    if isinstance(given, dict):
        return (
            isinstance(stored, dict)
            and stored.keys() == given.keys()
            and all(same_json(stored[k], given[k]) for k in given)
        )
    if isinstance(given, list):
        return (
            isinstance(stored, list)
            and len(stored) == len(given)
            and all(same_json(s, g) for s, g in zip(stored, given, strict=True))
        )
    return type(stored) is type(given) and stored == given


def reads_back_equal(conn: psycopg.Connection, schema: str, sent: ActionRequest) -> None:
    [row] = [r for r in rows(conn, schema) if r["idempotency_key"] == sent.idempotency_key]
    action = get_action(conn, row["id"], schema=schema)
    assert action is not None
    text = lambda v: None if v is None else str(v)  # noqa: E731 (ids are stored as text)
    assert (
        action.kind,
        action.lane_key,
        action.idempotency_key,
        action.workspace_id,
        action.subject_account_id,
        action.max_attempts,
        action.expires_at,
    ) == (
        sent.kind_name,
        sent.lane_key,
        sent.idempotency_key,
        text(sent.workspace_id),
        text(sent.subject_account_id),
        sent.max_attempts,
        sent.expires_at,
    )
    assert same_json(action.payload, sent.payload), (action.payload, sent.payload)


# -- the four entry points, run on one connection each ------------------------------------------


class Caller:
    """Enqueues on one connection with one of the four entry points, and runs a statement on the
    same connection (an async one runs on its own event loop, kept for the whole test)."""

    def __init__(self, mode: str, database_url: str, schema: str) -> None:
        self.mode = mode
        self.schema = schema
        self.loop: asyncio.AbstractEventLoop | None = None
        self.sync: psycopg.Connection | None = None
        self.aconn: psycopg.AsyncConnection | None = None
        if mode.endswith("async"):
            self.loop = asyncio.new_event_loop()
            self.aconn = self.loop.run_until_complete(psycopg.AsyncConnection.connect(database_url))
        else:
            self.sync = psycopg.connect(database_url)

    def batch(self, requests: list[ActionRequest]) -> None:
        """Enqueues ``requests``: one by one for ``enqueue``, as one batch for ``enqueue_many``."""
        s = self.schema
        if self.mode == "enqueue":
            for r in requests:
                enqueue(self.sync, r, schema=s)
        elif self.mode == "enqueue_many":
            enqueue_many(self.sync, requests, schema=s)
        elif self.mode == "enqueue_async":

            async def each() -> None:
                for r in requests:
                    await enqueue_async(self.aconn, r, schema=s)

            self.loop.run_until_complete(each())
        else:
            self.loop.run_until_complete(enqueue_many_async(self.aconn, requests, schema=s))

    def execute(self, sql: str) -> list[tuple]:
        """Runs ``sql`` and returns its rows (none for a statement that returns no rows)."""
        if self.sync is not None:
            cursor = self.sync.execute(sql)
            return cursor.fetchall() if cursor.description else []

        async def run() -> list[tuple]:
            cursor = await self.aconn.execute(sql)
            return await cursor.fetchall() if cursor.description else []

        return self.loop.run_until_complete(run())

    def commit(self) -> None:
        if self.sync is not None:
            self.sync.commit()
        else:
            self.loop.run_until_complete(self.aconn.commit())

    def rollback(self) -> None:
        if self.sync is not None:
            self.sync.rollback()
        else:
            self.loop.run_until_complete(self.aconn.rollback())

    def close(self) -> None:
        if self.sync is not None:
            self.sync.close()
        else:
            self.loop.run_until_complete(self.aconn.close())
            self.loop.close()


@pytest.fixture
def outbox(make_outbox) -> Outbox:
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    return ob


@pytest.fixture(params=["enqueue", "enqueue_many", "enqueue_async", "enqueue_many_async"])
def caller(request, outbox, database_url, schema) -> Iterator[Caller]:
    made = Caller(request.param, database_url, schema)
    yield made
    made.close()


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(hostile=hostile_fields)
def test_any_field_is_written_and_reads_back_or_refused_by_name_leaving_the_transaction_usable(
    caller: Caller, database_url: str, schema: str, hostile: tuple[str, Any]
) -> None:
    field, value = hostile
    caller.rollback()  # an example that failed must not leave the next one a broken transaction
    caller.execute(f'DELETE FROM "{schema}".agent_action')
    caller.commit()
    sent = request("hostile", **{field: value})
    # In a batch the hostile request sits between two good ones (whose keys differ from any
    # hostile key: these hold characters the strategies never produce together).
    batch = [request("good-before#"), sent, request("good-after#")]
    refusal: InvalidActionRequest | None = None
    try:
        caller.batch(batch)
    except InvalidActionRequest as error:
        refusal = error
    event(f"{field}: {'refused' if refusal else 'written'}")
    one_by_one = not caller.mode.startswith("enqueue_many")
    if refusal is not None:
        assert refusal.field == field, (refusal, value)
        assert refusal.message and field in str(refusal)
        if not one_by_one:
            assert refusal.index == 1 and str(refusal).startswith("request 1: ")
    # Either way, the transaction is usable: a statement, another enqueue, a commit.
    assert caller.execute("SELECT 1") == [(1,)]
    caller.batch([request("after#")])
    caller.commit()
    with psycopg.connect(database_url) as check:
        keys = sorted(r["idempotency_key"] for r in rows(check, schema))
        if refusal is not None:
            # Nothing of the refused request (nor, in a batch, of the batch) was written; one by
            # one, the good request before it was.
            assert keys == sorted(["after#"] + (["good-before#"] if one_by_one else []))
        else:
            expected = ["good-before#", sent.idempotency_key, "good-after#", "after#"]
            assert keys == sorted(expected)
            reads_back_equal(check, schema, sent)


# -- the limits, at their edges -----------------------------------------------------------------


def test_text_fields_are_limited_in_utf8_bytes_not_characters(outbox, conn, schema) -> None:
    fits = "é" * (MAX_KEY_BYTES // 2)  # two bytes each: exactly the limit
    enqueue(conn, request(fits, lane_key=fits, subject_account_id=fits), schema=schema)
    for field in ("idempotency_key", "lane_key", "workspace_id", "subject_account_id"):
        with pytest.raises(InvalidActionRequest) as raised:
            enqueue(conn, request("k", **{field: fits + "x"}), schema=schema)
        assert raised.value.field == field
        assert f"{MAX_KEY_BYTES + 1} bytes" in raised.value.message
    conn.commit()
    assert [r["idempotency_key"] for r in rows(conn, schema)] == [fits]


def test_max_attempts_is_refused_past_its_bound(outbox, conn, schema) -> None:
    enqueue(conn, request("most", max_attempts=MAX_ATTEMPTS), schema=schema)
    for bad in (MAX_ATTEMPTS + 1, 2**40, True, 3.0):
        with pytest.raises(InvalidActionRequest) as raised:
            enqueue(conn, request("k", max_attempts=bad), schema=schema)
        assert raised.value.field == "max_attempts"
    conn.commit()
    assert [r["max_attempts"] for r in rows(conn, schema)] == [MAX_ATTEMPTS]


def _payload_of(size: int) -> dict[str, str]:
    """A payload whose compact JSON is exactly ``size`` bytes: {"b":"xx..."} is 8 + n bytes."""
    return {"b": "x" * (size - 8)}


def test_payload_limit_is_measured_on_the_json_and_configurable(
    outbox, conn, schema, monkeypatch
) -> None:
    enqueue(
        conn, request("at-limit", payload=_payload_of(DEFAULT_MAX_PAYLOAD_BYTES)), schema=schema
    )
    with pytest.raises(InvalidActionRequest) as raised:
        enqueue(
            conn, request("over", payload=_payload_of(DEFAULT_MAX_PAYLOAD_BYTES + 1)), schema=schema
        )
    assert raised.value.field == "payload"
    assert f"{DEFAULT_MAX_PAYLOAD_BYTES + 1} bytes" in raised.value.message
    # A parameter, the environment, or the Outbox's settings lower it.
    with pytest.raises(InvalidActionRequest):
        enqueue(conn, request("p", payload=_payload_of(101)), schema=schema, max_payload_bytes=100)
    enqueue(conn, request("p", payload=_payload_of(100)), schema=schema, max_payload_bytes=100)
    monkeypatch.setenv("OUTBOX_MAX_PAYLOAD_BYTES", "50")
    with pytest.raises(InvalidActionRequest):
        enqueue_many(conn, [request("e", payload=_payload_of(51))], schema=schema)
    small = Outbox(settings=Settings(schema=schema, max_payload_bytes=30))
    with pytest.raises(InvalidActionRequest) as raised:
        small.enqueue_many(conn, [request("o1"), request("o2", payload=_payload_of(31))])
    assert (raised.value.field, raised.value.index) == ("payload", 1)
    conn.commit()
    assert sorted(r["idempotency_key"] for r in rows(conn, schema)) == ["at-limit", "p"]


def test_payload_limit_setting_comes_from_the_environment_and_is_checked() -> None:
    assert Settings.from_env({}).max_payload_bytes == DEFAULT_MAX_PAYLOAD_BYTES == 65536
    assert Settings.from_env({"OUTBOX_MAX_PAYLOAD_BYTES": "1024"}).max_payload_bytes == 1024
    for raw in ("0", "-5", "lots"):
        with pytest.raises(ConfigurationError, match=r"max_payload_bytes|MAX_PAYLOAD_BYTES"):
            Settings.from_env({"OUTBOX_MAX_PAYLOAD_BYTES": raw})


@pytest.mark.parametrize(
    ("payload", "says"),
    [
        ({"ids": (1, 2)}, "tuple"),
        ({1: "a"}, "keys must be strings"),
        ({"x": float("inf")}, "not JSON-serialisable"),
        ({"x": {"y": ["ok", "a\x00b"]}}, "payload['x']['y'][1] contains a NUL"),
        ({"a\ud800": 1}, "lone surrogate"),
        ({"x": 10**4400}, "not JSON-serialisable"),
    ],
)
def test_payload_refusal_says_where(outbox, conn, schema, payload, says) -> None:
    with pytest.raises(InvalidActionRequest) as raised:
        enqueue(conn, request("k", payload=payload), schema=schema)
    assert raised.value.field == "payload" and says in raised.value.message


class _Level(IntEnum):
    HIGH = 2


class _Colour(StrEnum):
    RED = "red"


class _Text(str):
    pass


class _General(dict):
    """The same payload as a dict subclass: the check's general path (encode, decode, compare)."""


#: Values of a flat payload (``checked_payload`` copies it instead of decoding its JSON): None,
#: booleans, integers (either side of Python's digit limit), hostile text.
flat_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.builds(lambda digits: -(10**digits), st.sampled_from([4299, 4300])),
    hostile_text,
)
flat_payloads = st.dictionaries(
    st.one_of(st.text(max_size=6), hostile_text),
    st.one_of(flat_values, st.text(max_size=10)),
    max_size=5,
)
#: Keys and values that make a payload not flat: what JSON cannot carry exactly, or reads back as
#: another type, or a container.
unflat_keys = st.one_of(st.integers(), st.booleans(), st.none())
unflat_values = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([_Level.HIGH, _Colour.RED, _Text("sub"), (1, 2), [1, "a"], {"n": None}]),
)
#: Flat payloads, and flat payloads with one key or value that makes them not flat.
payloads_flat_or_nearly = st.one_of(
    flat_payloads,
    st.builds(
        lambda payload, key, value: {**payload, key: value}, flat_payloads, unflat_keys, flat_values
    ),
    st.builds(
        lambda payload, key, value: {**payload, key: value},
        flat_payloads,
        st.text(max_size=6),
        unflat_values,
    ),
)


def _outcome(payload: Any, max_bytes: int) -> tuple[str, Any, Any]:
    try:
        return ("accepted", *checked_payload(payload, max_bytes))
    except InvalidActionRequest as error:
        return ("refused", error.field, error.message)


@settings(max_examples=400, deadline=None)
@given(
    payload=payloads_flat_or_nearly,
    max_bytes=st.sampled_from([40, 2000, DEFAULT_MAX_PAYLOAD_BYTES]),
)
@example(payload={"a\x00": 1}, max_bytes=DEFAULT_MAX_PAYLOAD_BYTES)
@example(payload={"k": "\ud800"}, max_bytes=DEFAULT_MAX_PAYLOAD_BYTES)
@example(payload={"k": 10**4300}, max_bytes=DEFAULT_MAX_PAYLOAD_BYTES)
@example(payload={"k": "x" * 40}, max_bytes=40)
@example(payload={"s": "\\u0000", "t": True, "n": None, "i": -7}, max_bytes=40)
@example(payload={}, max_bytes=40)
def test_a_flat_payload_is_checked_without_decoding_as_any_payload_is(
    payload: dict[Any, Any], max_bytes: int
) -> None:
    """A dict of str keys and str, int, bool or None values (exact types) is copied, not decoded
    from its JSON; it is refused, or accepted with the same JSON and an equal copy, exactly as
    the general path (encode, decode, compare) does with the same payload."""
    flat = all(type(k) is str for k in payload) and all(
        type(v) in (str, int, bool, type(None)) for v in payload.values()
    )
    with mock.patch.object(request_checks, "json", wraps=json) as spy:
        got = _outcome(payload, max_bytes)
    if flat:
        assert not spy.loads.called
    general = _outcome(_General(payload), max_bytes)
    event(f"{'flat' if flat else 'not flat'}: {got[0]}")
    assert got == general
    if got[0] == "accepted":
        copy = got[2]
        assert type(copy) is dict and copy is not payload
        types = [(type(k), type(v)) for k, v in copy.items()]
        assert types == [(type(k), type(v)) for k, v in general[2].items()]


def test_escaped_nul_spelled_out_in_text_is_not_a_nul(outbox, conn, schema) -> None:
    action = enqueue(conn, request("k", payload={"s": "\\u0000"}), schema=schema)
    assert action.payload == {"s": "\\u0000"}


def test_kind_names_are_checked_before_the_database(outbox, conn, schema) -> None:
    for bad in ("note", "NOTE\n", "NO\x00TE", "N" * 64):
        with pytest.raises(InvalidActionRequest) as raised:
            enqueue(conn, request("k", kind=bad), schema=schema)
        assert raised.value.field == "kind"
    assert conn.execute("SELECT 1").fetchone() == (1,)
    with pytest.raises(ValueError):
        ActionKind("NOTE\n")


def test_a_batch_refusal_names_the_first_bad_requests_index(outbox, conn, schema) -> None:
    batch = [request(f"k{i}") for i in range(5)]
    batch[3] = replace(batch[3], lane_key="a\x00b")
    batch[4] = replace(batch[4], max_attempts=0)
    with pytest.raises(InvalidActionRequest) as raised:
        enqueue_many(conn, batch, schema=schema)
    assert (raised.value.field, raised.value.index) == ("lane_key", 3)
    assert str(raised.value) == "request 3: lane_key: must not contain a NUL character (\\x00)"
    assert rows(conn, schema) == []


def test_expiry_that_python_could_not_read_back_is_refused(outbox, conn, schema) -> None:
    # 10000-01-01 in UTC: the database would store it, and the action could not be returned.
    far = datetime(9999, 12, 31, 23, 0, tzinfo=timezone(-timedelta(hours=23, minutes=59)))
    with pytest.raises(InvalidActionRequest) as raised:
        enqueue(conn, request("far", expires_at=far), schema=schema)
    assert raised.value.field == "expires_at"
    latest = datetime(9998, 12, 31, tzinfo=timezone(timedelta(hours=14)))
    assert enqueue(conn, request("late", expires_at=latest), schema=schema).expires_at == latest
    conn.commit()
    assert [r["idempotency_key"] for r in rows(conn, schema)] == ["late"]
