"""The checks that keep a bad request away from the database.

Every value the enqueue statement sends is checked here first, so that bad input is refused with
``InvalidActionRequest`` naming its field, and never reaches PostgreSQL as a statement that fails
(which would abort the caller's whole transaction). The limits:

- text (kind, lane and idempotency keys, workspace and account ids): valid Unicode (no lone
  surrogates), no NUL (PostgreSQL's ``text`` cannot hold one), at most ``MAX_KEY_BYTES`` in UTF-8;
- ``max_attempts``: 1 to ``MAX_ATTEMPTS``;
- ``expires_at``: timezone-aware, before ``EXPIRES_AT_LIMIT`` (the year 9999);
- ``payload``: JSON that reads back equal to what was given (no NaN or infinity, no tuples, no
  non-string keys, no other types), no NUL and no lone surrogate in any string or key, and at
  most ``max_payload_bytes`` as compact UTF-8 JSON.

The payload check runs in C for an acceptable payload (encode, decode, compare); the common flat
payload, a dict of strings, integers, booleans and nulls, is encoded and copied in a short Python
loop instead, cheaper than the encoder's setup. Only a refused payload is walked in Python to say
where it is bad.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from json.encoder import encode_basestring
from typing import Any

from outbox.errors import InvalidActionRequest

#: Longest text field, in bytes of UTF-8. Keys and ids are B-tree index entries (the idempotency
#: key's unique index, the lane index and lane table, the account index), and PostgreSQL refuses
#: an index entry over about 2.7 kB (a third of a page) with an error; 1 KiB stays clear of that
#: with the other columns of a composite entry, and is far longer than any identifier needs.
MAX_KEY_BYTES = 1024
#: Most attempts an action may allow. The column is a 32-bit integer; past a thousand attempts
#: (over 40 days of hourly retries at the default backoff cap) a retry loop is a bug, not a plan.
MAX_ATTEMPTS = 1000
#: ``expires_at`` must be earlier: a later time, read back in some time zone, can fall past the
#: year 9999 that Python's datetime ends with, and the enqueued action could not be returned.
EXPIRES_AT_LIMIT = datetime(9999, 1, 1, tzinfo=UTC)
#: Default of ``Settings.max_payload_bytes`` (``OUTBOX_MAX_PAYLOAD_BYTES``): a payload holds
#: identifiers the adapter reads the rest by, so 64 KiB is generous.
DEFAULT_MAX_PAYLOAD_BYTES = 64 * 1024

_JSON = json.JSONEncoder(ensure_ascii=False, allow_nan=False, separators=(",", ":"))
_ESCAPED_NUL = "\\u0000"


def check_text(field: str, value: str) -> None:
    """Refuses text PostgreSQL cannot store or index (see ``MAX_KEY_BYTES``)."""
    if value.isascii():  # O(1) in CPython: the common case costs a length and a scan for NUL
        size = len(value)
    else:
        try:
            size = len(value.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidActionRequest(
                field, "contains a lone surrogate, which is not valid Unicode text"
            ) from None
    if "\x00" in value:
        raise InvalidActionRequest(field, "must not contain a NUL character (\\x00)")
    if size > MAX_KEY_BYTES:
        raise InvalidActionRequest(
            field, f"is {size} bytes in UTF-8; at most {MAX_KEY_BYTES} are allowed"
        )


def id_text(field: str, value: str | int) -> str:
    """A workspace or account id as the text it is stored as, checked like any text."""
    if isinstance(value, int):
        try:
            text = str(value)
        except ValueError:  # more digits than Python converts
            raise InvalidActionRequest(
                field, f"is an integer too large; at most {MAX_KEY_BYTES} digits"
            ) from None
    else:
        text = value
    check_text(field, text)
    return text


def check_max_attempts(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_ATTEMPTS:
        raise InvalidActionRequest("max_attempts", f"must be an integer from 1 to {MAX_ATTEMPTS}")


def check_expires_at(value: object, name: str = "expires_at") -> None:
    """``expires_at`` (and ``not_before``, with ``name``): None, or an aware datetime the
    database can store."""
    if value is None:
        return
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise InvalidActionRequest(name, "must be a timezone-aware datetime")
    try:
        value.astimezone(UTC)  # what is sent (see utc); raises before the year 1 in UTC
    except OverflowError:
        raise InvalidActionRequest(name, "is before the year 1 in UTC") from None
    if value >= EXPIRES_AT_LIMIT:
        raise InvalidActionRequest(name, f"must be before {EXPIRES_AT_LIMIT:%Y-%m-%d} UTC")


#: Priorities run from MIN_PRIORITY to MAX_PRIORITY, higher first (a smallint column with a
#: check; a few levels are all a sender needs, and a bound keeps hostile values out).
MIN_PRIORITY = -100
MAX_PRIORITY = 100


def check_priority(value: object) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int)
        or not MIN_PRIORITY <= value <= MAX_PRIORITY
    ):
        raise InvalidActionRequest(
            "priority", f"must be an integer from {MIN_PRIORITY} to {MAX_PRIORITY} (higher first)"
        )


def utc(value: datetime | None) -> datetime | None:
    """A checked ``expires_at`` in UTC, the same instant: PostgreSQL refuses offsets past 15:59
    and fractions of a second in the text form a batch sends."""
    return None if value is None else value.astimezone(UTC)


def encoded_payload(payload: Any, max_bytes: int) -> bytes:
    """The payload as compact UTF-8 JSON, the bytes the database receives; refuses what JSON
    cannot carry exactly, what PostgreSQL's ``jsonb`` cannot store, and what is too large."""
    return checked_payload(payload, max_bytes)[0].encode("utf-8")


def checked_payload(payload: Any, max_bytes: int) -> tuple[str, Any]:
    """``encoded_payload``'s checks; returns the compact JSON as text and the value it decodes
    to (a copy of the payload that shares nothing with the caller's, equal to it)."""
    if payload is None:
        raise InvalidActionRequest("payload", "must be JSON, not None (use {} for nothing)")
    try:
        text = _flat_json(payload)
        if text is not None:
            # The common payload reads back from its JSON as itself (see _flat_json): copied,
            # not decoded and compared.
            copy: Any = dict(payload)
            exact = True
        else:
            text = _JSON.encode(payload)
            copy = json.loads(text)
            exact = copy == payload
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidActionRequest("payload", f"is not JSON-serialisable: {error}") from None
    if not exact:
        raise InvalidActionRequest("payload", _inexact(payload, "payload"))
    if text.isascii():  # O(1): no surrogate, and a character a byte
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError:
            raise InvalidActionRequest(
                "payload", f"{_find(payload, 'payload', _surrogate)} contains a lone surrogate"
            ) from None
    # jsonb refuses \u0000 in a string or a key. The escape can also be text that a string
    # spells out with a backslash of its own, so a hit is confirmed on the value itself.
    if _ESCAPED_NUL in text:
        where = _find(payload, "payload", _nul)
        if where is not None:
            raise InvalidActionRequest("payload", f"{where} contains a NUL character (\\x00)")
    if size > max_bytes:
        raise InvalidActionRequest(
            "payload",
            f"is {size} bytes as JSON; at most {max_bytes} are allowed "
            "(OUTBOX_MAX_PAYLOAD_BYTES): keep identifiers in it, not documents",
        )
    return text, copy


#: JSON's words for the flat payload's constants.
_LITERALS = {True: "true", False: "false", None: "null"}


def _flat_json(payload: Any) -> str | None:
    """The compact JSON of the common payload, a ``dict`` (the exact type) of ``str`` keys and
    values that are ``str``, ``int``, ``bool`` or None (exact types, no subclass), as ``_JSON``
    writes it; None for any other payload, which ``_JSON`` encodes.

    Each such key and value reads back from its JSON as an equal value of the same type, so the
    payload needs no decoding and comparing, and ``dict(payload)`` is the copy ``json.loads``
    would make (it shares nothing mutable: keys and values are immutable). Written here because
    ``_JSON.encode`` spends a microsecond setting up before the first character, more than this
    takes for a payload of a few fields. Strings go through ``_JSON``'s own escaping; an int
    past Python's digit limit raises ``ValueError`` as in ``_JSON``. Lone surrogates and NULs
    pass through, as they do ``_JSON``, to be refused on the text after it."""
    if type(payload) is not dict:
        return None
    items = []
    for key, value in payload.items():
        if type(key) is not str:
            return None
        kind = type(value)
        if kind is str:
            items.append(f"{encode_basestring(key)}:{encode_basestring(value)}")
        elif kind is int:
            items.append(f"{encode_basestring(key)}:{value!r}")
        elif kind is bool or value is None:
            items.append(f"{encode_basestring(key)}:{_LITERALS[value]}")
        else:
            return None
    return "{" + ",".join(items) + "}"


def _surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _nul(text: str) -> bool:
    return "\x00" in text


def _find(value: Any, path: str, bad: Any) -> str | None:
    """The path of the first string or key in ``value`` that ``bad`` says is bad."""
    if isinstance(value, str):
        return path if bad(value) else None
    if isinstance(value, dict):
        for key, item in value.items():
            if isinstance(key, str) and bad(key):
                return f"the key {path}[{key!r}]"
            found = _find(item, f"{path}[{key!r}]", bad)
            if found is not None:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = _find(item, f"{path}[{index}]", bad)
            if found is not None:
                return found
    return None


def _inexact(value: Any, path: str) -> str:
    """Why ``value`` would not read back equal to itself from JSON, and where."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{path} has the key {key!r}: JSON object keys must be strings"
            if _changes(item):
                return _inexact(item, f"{path}[{key!r}]")
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if _changes(item):
                return _inexact(item, f"{path}[{index}]")
    elif isinstance(value, tuple):
        return f"{path} is a tuple: JSON has lists only (pass a list)"
    return f"{path} ({type(value).__name__}) would not read back equal from JSON"


def _changes(value: Any) -> bool:
    return json.loads(_JSON.encode(value)) != value
