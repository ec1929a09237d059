"""The ended counter's ``reason`` label is a bounded set whatever adapters return, and the
metrics endpoint listens on loopback unless ``OUTBOX_METRICS_HOST`` widens it."""

from __future__ import annotations

import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from outbox import ActionKind, ActionRequest, Failed, Uncertain, enqueue, metrics
from outbox.config import Settings
from outbox.metrics import (
    MAX_ADAPTER_REASONS,
    OTHER_REASON,
    REASON_LABEL,
    reason_label,
    start_metrics_server,
)
from outbox.state import StopReason
from outbox.testing import drain
from tests.support import ScriptedAdapter

CHATTY = ActionKind("LABEL_BOUND")
OUTBOX_REASONS = {v for k, v in vars(StopReason).items() if k.isupper()}


@pytest.fixture
def fresh_reasons(monkeypatch):
    """This process's admitted adapter reasons start empty (and come back after the test)."""
    monkeypatch.setattr(metrics, "_adapter_reasons", set())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=80) | st.from_regex(REASON_LABEL, fullmatch=True), max_size=200))
def test_reason_labels_are_known_codes_or_other_and_at_most_the_cap(reasons):
    saved = metrics._adapter_reasons
    metrics._adapter_reasons = set()
    try:
        labels = {reason_label(r) for r in reasons}
    finally:
        metrics._adapter_reasons = saved
    for label in labels:
        assert label == OTHER_REASON or REASON_LABEL.match(label)
    assert len(labels - OUTBOX_REASONS - {OTHER_REASON}) <= MAX_ADAPTER_REASONS


def test_outbox_stop_reasons_pass_even_past_the_cap(fresh_reasons):
    for i in range(MAX_ADAPTER_REASONS + 5):
        reason_label(f"CODE_{i}")
    assert reason_label("CODE_0") == "CODE_0"
    assert reason_label(f"CODE_{MAX_ADAPTER_REASONS + 1}") == OTHER_REASON
    for reason in OUTBOX_REASONS:
        assert reason_label(reason) == reason


def test_a_drain_of_free_text_reasons_counts_them_under_other(
    make_outbox, database_url, schema, fresh_reasons
):
    def script(attempt):
        key = attempt.idempotency_key
        if key.startswith("text"):
            return Failed(f"550 mailbox {key}@example.org unavailable")  # free text
        return Uncertain("SMTP_DATA_TIMEOUT")  # a code

    ob = make_outbox()
    ob.register(CHATTY, ScriptedAdapter(script, fence=False))
    ob.migrate()
    keys = [f"text-{i}" for i in range(20)] + ["code"]
    with psycopg.connect(database_url) as conn:
        for key in keys:
            enqueue(
                conn,
                ActionRequest(CHATTY, lane_key=key, idempotency_key=key, workspace_id="w"),
                schema=schema,
            )
        conn.commit()

    def value(reason, state):
        labels = {"kind": CHATTY.name, "state": state, "reason": reason}
        return REGISTRY.get_sample_value("outbox_action_ended_total", labels) or 0.0

    before = value(OTHER_REASON, "FAILED"), value("SMTP_DATA_TIMEOUT", "UNCERTAIN")
    drain(ob)
    assert value(OTHER_REASON, "FAILED") - before[0] == 20
    assert value("SMTP_DATA_TIMEOUT", "UNCERTAIN") - before[1] == 1
    reasons = {
        s.labels["reason"]
        for family in REGISTRY.collect()
        if family.name == "outbox_action_ended"
        for s in family.samples
        if s.labels.get("kind") == CHATTY.name
    }
    assert reasons == {OTHER_REASON, "SMTP_DATA_TIMEOUT"}


def test_the_metrics_endpoint_listens_on_loopback_unless_widened(monkeypatch):
    monkeypatch.delenv("OUTBOX_METRICS_HOST", raising=False)
    assert Settings().metrics_host == "127.0.0.1"
    server = start_metrics_server(0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
    monkeypatch.setenv("OUTBOX_METRICS_HOST", "0.0.0.0")
    assert Settings.from_env().metrics_host == "0.0.0.0"
    server = start_metrics_server(0)
    try:
        assert server.server_address[0] == "0.0.0.0"
    finally:
        server.shutdown()
        server.server_close()
