"""Metrics: the counters carry the contract's labels and the gauges describe the real backlog,
served over HTTP, also in prometheus_client's multiprocess mode next to Dramatiq's metrics; the
UNCERTAIN warning is one structured line without payload."""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
import time
import urllib.request
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from outbox import (
    ActionKind,
    ActionRequest,
    Cancelled,
    Done,
    Failed,
    Retry,
    Uncertain,
    enqueue,
)
from outbox.maintenance.gauges import refresh_backlog_gauges
from outbox.metrics import start_metrics_server
from outbox.testing import drain
from tests.support import ScriptedAdapter

GAUGED = ActionKind("GAUGED")
MIXED = ActionKind("MIXED_METRICS")


def put(conn, schema, kind, key, lane=None, **fields):
    request = ActionRequest(
        kind, lane_key=lane or f"lane-{key}", idempotency_key=key, workspace_id="w", **fields
    )
    return enqueue(conn, request, schema=schema).id


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_backlog_gauges_count_due_age_in_flight_and_blocked_lanes(
    make_outbox, database_url, schema
):
    def script(attempt):
        # Lane heads "blocked*" fail once and wait an hour for their retry.
        if attempt.lane_key.startswith("blocked"):
            return Retry(after=timedelta(hours=1))
        return Done()

    ob = make_outbox()
    ob.register(GAUGED, ScriptedAdapter(script))
    ob.migrate()

    async def claim(run: bool):
        async with ob.store() as store:
            if run:
                return await ob.claim_and_run(ob.executor(store))
            return await store.claim({GAUGED.name: 10}, ob.settings.lease)

    with psycopg.connect(database_url) as conn:
        head = put(conn, schema, GAUGED, "head", lane="blocked")
        alone = put(conn, schema, GAUGED, "alone", lane="blocked-alone")  # nothing behind it
        conn.commit()
        assert {o.action_id for o in asyncio.run(claim(run=True))} == {head, alone}
        running = put(conn, schema, GAUGED, "running")
        conn.commit()
        assert [c.action.id for c in asyncio.run(claim(run=False))] == [running]  # in flight
        put(conn, schema, GAUGED, "behind", lane="blocked")
        old = [put(conn, schema, GAUGED, f"due-{i}") for i in range(3)]
        put(conn, schema, GAUGED, "later")  # not due for a day
        conn.execute(
            f"UPDATE \"{schema}\".agent_action SET available_at = now() + interval '1 day'"
            " WHERE idempotency_key = 'later'"
        )
        conn.execute(
            f"UPDATE \"{schema}\".agent_action SET available_at = now() - interval '120 seconds'"
            " WHERE id = %s",
            [old[0]],
        )
        conn.commit()

    async def refresh():
        async with ob.store() as store:
            return await refresh_backlog_gauges(store)

    backlog = asyncio.run(refresh())
    item = backlog.kinds[GAUGED.name]
    # Due: the three "due-*" and "behind" (due, though its lane waits for the retrying head).
    assert item.due == 4
    assert 120 <= item.oldest_due_age < 150
    assert item.in_flight == 1
    # "blocked" has a retrying head with "behind" waiting; "blocked-alone" has nobody behind.
    assert item.blocked_lanes == 1
    assert sample("outbox_actions_due", kind=GAUGED.name) == 4
    assert 120 <= sample("outbox_oldest_due_age_seconds", kind=GAUGED.name) < 150
    assert sample("outbox_actions_in_flight", kind=GAUGED.name, queue="outbox.gauged") == 1
    assert sample("outbox_lanes_blocked", kind=GAUGED.name) == 1
    # The two heads that retried are the kind's retrying actions since its last DONE (none yet).
    assert (item.retrying, sample("outbox_provider_retrying_actions", kind=GAUGED.name)) == (2, 2)
    assert 0 <= sample("outbox_provider_retrying_seconds", kind=GAUGED.name) < 60
    assert sample("outbox_provider_held_seconds", kind=GAUGED.name) == 0  # two: not down
    with psycopg.connect(database_url) as conn:
        conn.execute(
            f'UPDATE "{schema}".agent_action_kind_outage'
            " SET held_until = now() + interval '30 seconds', holds = 1"
        )
    asyncio.run(refresh())
    assert 25 < sample("outbox_provider_held_seconds", kind=GAUGED.name) <= 30
    # The built-in kind is reported too, at zero.
    assert sample("outbox_actions_due", kind="EMAIL") == 0
    assert sample("outbox_provider_retrying_actions", kind="EMAIL") == 0


def test_a_scrape_shows_the_counters_with_their_labels_after_a_drain_of_a_known_mix(
    make_outbox, database_url, schema
):
    plan = {
        "done": [Done("ref")],
        "failed": [Failed("REJECTED")],
        "uncertain": [Uncertain("TIMEOUT")],
        "cancelled": [Cancelled("UNSUBSCRIBED")],
        "retry-then-done": [Retry(), Done("ref")],
    }
    seen: dict[str, int] = {}

    def script(attempt):
        n = seen.get(attempt.idempotency_key, 0)
        seen[attempt.idempotency_key] = n + 1
        return plan[attempt.idempotency_key][n]

    ob = make_outbox()
    ob.register(MIXED, ScriptedAdapter(script))
    ob.migrate()
    with psycopg.connect(database_url) as conn:
        for key in plan:
            put(conn, schema, MIXED, key)
        conn.commit()
    server = start_metrics_server(0, addr="127.0.0.1")
    try:
        before = scrape(server.server_port)
        drain(ob)
        after = scrape(server.server_port)
    finally:
        server.shutdown()
        server.server_close()

    def delta(name, **labels):
        key = (name, tuple(sorted({"kind": MIXED.name, **labels}.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    attempts = "outbox_action_attempts_total"
    assert delta(attempts, result="done", recorded="true") == 2
    assert delta(attempts, result="retry", recorded="true") == 1
    for result in ("failed", "uncertain", "cancelled"):
        assert delta(attempts, result=result, recorded="true") == 1
    ended = "outbox_action_ended_total"
    assert delta(ended, state="DONE", reason="DONE") == 2
    assert delta(ended, state="FAILED", reason="REJECTED") == 1
    assert delta(ended, state="UNCERTAIN", reason="TIMEOUT") == 1
    assert delta(ended, state="CANCELLED", reason="UNSUBSCRIBED") == 1
    total_ended = sum(
        v - before.get(k, 0.0)
        for k, v in after.items()
        if k[0] == ended and dict(k[1])["kind"] == MIXED.name
    )
    assert total_ended == len(plan)


CHILD_OUTBOX = """
import sys
from outbox import metrics
metrics.record_attempt("CHILD", "done", True)
metrics.record_ended("CHILD", "DONE", "DONE")
print("ok", flush=True)
"""

CHILD_DRAMATIQ = """
import dramatiq
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware.prometheus import Prometheus
middleware = Prometheus()
middleware.after_process_boot(StubBroker())
middleware.total_messages.labels("outbox.child", "run_action").inc()
print("ok", flush=True)
"""


def test_multiprocess_mode_one_endpoint_shows_every_process_and_dramatiqs_metrics(
    tmp_path, monkeypatch
):
    directory = tmp_path / "prom"
    directory.mkdir()
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(directory),
        "dramatiq_prom_db": str(directory),
    }
    for code in (CHILD_OUTBOX, CHILD_OUTBOX, CHILD_DRAMATIQ):
        done = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
        )
        assert done.stdout.strip() == "ok", done.stderr
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(directory))
    server = start_metrics_server(0, addr="127.0.0.1")
    try:
        samples = scrape(server.server_port)
    finally:
        server.shutdown()
        server.server_close()
    child = (("kind", "CHILD"), ("recorded", "true"), ("result", "done"))
    assert samples[("outbox_action_attempts_total", child)] == 2  # two processes, summed
    ended = (("kind", "CHILD"), ("reason", "DONE"), ("state", "DONE"))
    assert samples[("outbox_action_ended_total", ended)] == 2
    dramatiq_key = (("actor_name", "run_action"), ("queue_name", "outbox.child"))
    assert samples[("dramatiq_messages_total", dramatiq_key)] == 1


def test_an_uncertain_end_writes_one_structured_warning_without_the_payload(
    make_outbox, database_url, schema, caplog
):
    kind = ActionKind("LOGGED")
    ob = make_outbox()
    ob.register(kind, ScriptedAdapter(lambda attempt: Uncertain("TIMEOUT_DURING_DATA")))
    ob.migrate()
    with psycopg.connect(database_url) as conn:
        action_id = put(
            conn, schema, kind, "k", payload={"to": "someone@example.org", "token": "s3cret"}
        )
        conn.commit()
    with caplog.at_level(logging.INFO, logger="outbox"):
        drain(ob)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1
    (record,) = warnings
    assert (record.event, record.action_id, record.kind, record.reason) == (
        "uncertain",
        action_id,
        "LOGGED",
        "TIMEOUT_DURING_DATA",
    )
    text = "\n".join(r.getMessage() + repr(r.__dict__) for r in caplog.records)
    assert "someone@example.org" not in text and "s3cret" not in text


def test_the_metrics_server_stops_when_shut_down():
    server = start_metrics_server(0, addr="127.0.0.1")
    bound = server.server_port
    assert scrape(bound) is not None
    server.shutdown()
    server.server_close()
    time.sleep(0.05)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{bound}/metrics", timeout=2)
