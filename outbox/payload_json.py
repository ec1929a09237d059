"""Payloads read back as the executor reads them: the standard library's JSON parser, called
without the layers around it.

Every claim and take reads each action's payload (``jsonb``), which psycopg parses with
``json.loads``: 5.7 us for a payload of a dozen bytes and 6.3 us for a mail's 800, a few per
cent of an in-process attempt's CPU. Most of it is ``json.loads``'s Python around its C scanner
(the encoding's detection, the decode, two whitespace matches, the decoder's calls); the
scanner alone takes 0.6 and 2.4 us. ``loads`` calls that scanner on the decoded text and takes
its value when it spans the whole text, as ``jsonb``'s output always does; any other text goes
to ``json.loads``, which answers (or raises) as before. The parse is the same: the default
decoder's scanner, the one ``json.loads`` runs.

The loader is set on the cursors of the statements that read actions (``Statement.rows``:
``outbox._io``) and nowhere else: the application's connections and the other statements
parse JSON as psycopg does.
"""

from __future__ import annotations

import json
from typing import Any

from psycopg.abc import Buffer
from psycopg.adapt import Loader

#: ``json.loads``' own scanner (the default decoder's: the same number and constant parsing).
_scan = json.decoder.JSONDecoder().scan_once  # type: ignore[attr-defined]  # set in __init__


def loads(data: Buffer) -> Any:
    """The value of a JSON text (UTF-8 bytes as psycopg reads them), as ``json.loads`` reads it."""
    text = bytes(data).decode()
    try:
        value, end = _scan(text, 0)
    except (StopIteration, ValueError, RecursionError):
        end = -1
    if end != len(text):
        return json.loads(text)
    return value


class PayloadLoader(Loader):
    """``jsonb`` in text format (as the outbox's statements read it)."""

    def load(self, data: Buffer) -> Any:
        return loads(data)


def read_payloads_fast(cursor: Any) -> None:
    """Sets ``cursor`` to parse ``jsonb`` (a payload's type) with ``PayloadLoader``: about 8 us
    a cursor (its adapters become its own), against 4 to 5 us saved a payload."""
    cursor.adapters.register_loader("jsonb", PayloadLoader)
