"""Log lines are structured (one JSON object with the extra fields) and never carry a payload, an
address or an exception's text, from a real drain."""

from __future__ import annotations

import io
import json
import logging

import psycopg

from outbox import ActionKind, ActionRequest, Done, Uncertain, enqueue
from outbox.logs import JsonFormatter, extra_fields
from outbox.testing import drain
from tests.support import ScriptedAdapter

CHATTY = ActionKind("CHATTY")
SECRET_ADDRESS = "person@example.org"


class Leaky(Exception):
    pass


def test_a_drain_logs_json_lines_with_fields_and_without_payload_or_error_text(
    make_outbox, database_url, schema
):
    def script(attempt):
        key = attempt.idempotency_key
        if key == "raises-before":
            # Raised before the fence: counts as a retry; its text quotes the address.
            raise Leaky(f"cannot reach {SECRET_ADDRESS}")
        return Uncertain("TIMEOUT") if key == "uncertain" else Done()

    ob = make_outbox()
    ob.register(CHATTY, ScriptedAdapter(script, fence=False))
    ob.migrate()
    with psycopg.connect(database_url) as conn:
        for key in ("uncertain", "raises-before", "fine"):
            request = ActionRequest(
                CHATTY,
                lane_key=key,
                idempotency_key=key,
                workspace_id="w",
                payload={"to": SECRET_ADDRESS},
                max_attempts=2,
            )
            enqueue(conn, request, schema=schema)
        conn.commit()

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("outbox")
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        drain(ob)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)

    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    events = sorted(line.get("event", "") for line in lines)
    assert events.count("uncertain") == 1
    assert events.count("adapter_error_before_fence") == 2  # both attempts of "raises-before"
    (uncertain,) = [line for line in lines if line.get("event") == "uncertain"]
    assert uncertain["level"] == "WARNING"
    assert (uncertain["kind"], uncertain["reason"]) == ("CHATTY", "TIMEOUT")
    errors = [line for line in lines if line.get("event") == "adapter_error_before_fence"]
    assert {line["error"] for line in errors} == {"Leaky"}
    assert SECRET_ADDRESS not in stream.getvalue()


def test_extra_fields_are_exactly_what_the_call_passed():
    record = logging.LogRecord("outbox", logging.INFO, __file__, 1, "m", None, None)
    record.__dict__.update({"event": "pruned", "pruned": 3})
    assert extra_fields(record) == {"event": "pruned", "pruned": 3}
    line = json.loads(JsonFormatter().format(record))
    assert (line["message"], line["event"], line["pruned"]) == ("m", "pruned", 3)
