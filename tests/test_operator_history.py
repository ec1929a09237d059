"""Attempt history: one row an attempt, written by the statements that take, fence and finish
it; never a payload, an address or an exception's text; erased and pruned with its action."""

from __future__ import annotations

import json
from datetime import timedelta

import psycopg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import ActionKind, ActionRequest, Done, Retry, Uncertain, enqueue, erase_subject
from outbox.operator import action_record, attempts_of
from outbox.retention import prune
from outbox.testing import drain
from tests.support import ScriptedAdapter

NOTE = ActionKind("HISTORY_NOTE")


def build(make_outbox, adapter):
    ob = make_outbox()
    ob.register(NOTE, adapter)
    ob.migrate()
    return ob


def put(conn, schema, key, *, payload=None, account=None, max_attempts=5):
    request = ActionRequest(
        NOTE,
        lane_key=f"lane-{key}",
        idempotency_key=key,
        workspace_id="w",
        subject_account_id=account,
        payload=payload if payload is not None else {"note": key},
        max_attempts=max_attempts,
    )
    action = enqueue(conn, request, schema=schema)
    conn.commit()
    return action.id


def test_each_attempt_has_its_row_across_retries(make_outbox, conn, schema):
    def script(attempt):
        if attempt.attempt < 3:
            return Retry(reason=f"BUSY_{attempt.attempt}")
        return Done("ref-final")

    ob = build(make_outbox, ScriptedAdapter(script))
    action_id = put(conn, schema, "a")
    drain(ob)
    attempts = attempts_of(conn, action_id, schema=schema)
    assert [(a.attempt, a.result, a.reason) for a in attempts] == [
        (1, "RETRY", "BUSY_1"),
        (2, "RETRY", "BUSY_2"),
        (3, "DONE", "DONE"),
    ]
    assert attempts[-1].provider_ref == "ref-final"
    for a in attempts:
        assert a.claimed_at <= a.taken_at <= a.fence_passed_at <= a.ended_at
        assert not a.lost


def test_an_adapter_error_keeps_its_class_not_its_text(make_outbox, conn, schema):
    secret = "alice@example.com said no"

    def script(attempt):
        if attempt.attempt == 1:
            return ValueError(secret)
        return Uncertain("TIMEOUT")

    ob = build(make_outbox, ScriptedAdapter(script))
    action_id = put(conn, schema, "b")
    drain(ob)
    attempts = attempts_of(conn, action_id, schema=schema)
    # A read-back kind's error after its fence is retried (the retry reads back first).
    assert [(a.result, a.error_class) for a in attempts] == [
        ("RETRY", "ValueError"),
        ("UNCERTAIN", None),
    ]
    assert secret not in json.dumps([a.as_dict() for a in attempts], default=str)


def test_the_fence_records_the_provider_ref_before_the_call(make_outbox, conn, schema):
    class RefAdapter:
        async def execute(self, attempt):
            if not await attempt.fence().begin_write("<m1@example.org>"):
                return None
            return Uncertain("SMTP_TIMEOUT_AFTER_DATA")

    ob = build(make_outbox, RefAdapter())
    action_id = put(conn, schema, "c")
    drain(ob)
    record = action_record(conn, action_id, schema=schema)
    assert record.action.state == "UNCERTAIN"
    assert [a.provider_ref for a in record.attempts] == ["<m1@example.org>"]
    assert record.payload_parked


def test_history_is_erased_with_its_subject_and_pruned_with_retention(
    make_outbox, conn, schema, database_url
):
    ob = build(make_outbox, ScriptedAdapter())
    erased = put(conn, schema, "d", account="acct-1")
    kept = put(conn, schema, "e", account="acct-2")
    drain(ob)
    count = f'SELECT count(*) FROM "{schema}".agent_action_attempt WHERE action_id = %s'
    assert conn.execute(count, (erased,)).fetchone()[0] == 1
    erase_subject(conn, "acct-1", schema=schema)
    conn.commit()
    assert conn.execute(count, (erased,)).fetchone()[0] == 0
    assert conn.execute(count, (kept,)).fetchone()[0] == 1
    conn.execute(f'UPDATE "{schema}".agent_action_attempt SET ended_at = ended_at')
    conn.commit()
    prune(conn, retention=timedelta(0), schema=schema)
    conn.commit()
    assert conn.execute(count, (kept,)).fetchone()[0] == 0


#: Marks every string of a generated payload, so that any of them showing up in the history is
#: found, whatever hypothesis generated (a short string could occur in a timestamp by chance).
SENTINEL = "zq§x"


def _marked(value):
    if isinstance(value, str):
        return SENTINEL + value
    if isinstance(value, list):
        return [_marked(v) for v in value]
    if isinstance(value, dict):
        return {SENTINEL + k: _marked(v) for k, v in value.items()}
    return value


#: What a payload may hold (an enqueue refuses NUL and lone surrogates).
_text = st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
_json = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payload=st.dictionaries(_text, _json, min_size=1, max_size=4), n=st.integers(0, 10**9))
def test_no_payload_value_ever_reaches_the_history(make_outbox, database_url, schema, payload, n):
    """Payloads (an address among them) reach the adapter, which raises with all of it in its
    exception's text after its fence: the history keeps the error's class, nothing else."""
    payload = {**_marked(payload), "to": f"{SENTINEL}addr-{n}@example.net"}

    def script(attempt):
        return RuntimeError(json.dumps(attempt.payload))

    ob = build(make_outbox, ScriptedAdapter(script))
    with psycopg.connect(database_url) as conn:
        # One attempt: its error after the fence ends it (the last attempt's retry fails it).
        key = f"p-{n}-{len(json.dumps(payload))}"
        action_id = put(conn, schema, key, payload=payload, max_attempts=1)
        drain(ob)
        rows = conn.execute(
            f'SELECT row_to_json(h)::text FROM "{schema}".agent_action_attempt h '
            "WHERE action_id = %s",
            (action_id,),
        ).fetchall()
    assert len(rows) == 1
    text = rows[0][0]
    assert "RuntimeError" in text and "ADAPTER_ERROR_AFTER_WRITE" in text
    assert SENTINEL not in text and json.dumps(SENTINEL)[1:-1] not in text
