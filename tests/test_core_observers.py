"""Observers: the executor reports every attempt, end (housekeeping's too) and adapter error to
the outbox's observers, in order; metrics and logs are two of them, and one that raises neither
stops the others nor changes what was written."""

from __future__ import annotations

import logging

import psycopg
from prometheus_client import REGISTRY

from outbox import ActionKind, ActionRequest, Done, Outbox, Retry, enqueue
from outbox.metrics import MetricsObserver
from outbox.observers import ExecutorObserver, LogObserver
from outbox.results import result_name
from outbox.testing import drain
from tests.support import ScriptedAdapter, rows

#: At-most-once: its adapter's exception after the fence ends the action UNCERTAIN (a read-back
#: kind's would be retried).
OBSERVED = ActionKind("OBSERVED", at_most_once=True)


class Seen(ExecutorObserver):
    def __init__(self) -> None:
        self.events: list[tuple[object, ...]] = []

    def on_attempt(self, outcome):
        self.events.append(
            ("attempt", outcome.action_id, result_name(outcome.result), outcome.recorded)
        )

    def on_ended(self, action_id, kind, state, reason):
        self.events.append(("ended", action_id, kind, state.value, reason))

    def on_adapter_error(self, attempt, error):
        self.events.append(("error", attempt.id, type(error).__name__, attempt.fence_passed))


class Broken(ExecutorObserver):
    def on_attempt(self, outcome):
        raise RuntimeError("observer bug")

    def on_ended(self, action_id, kind, state, reason):
        raise RuntimeError("observer bug")

    def on_adapter_error(self, attempt, error):
        raise RuntimeError("observer bug")


def script(attempt):
    plan = attempt.payload["plan"]
    if plan == "retry-then-done":
        return Retry(reason="HTTP_503") if attempt.attempt == 1 else Done("ok")
    return ValueError("provider reply with data")  # raised after the fence


def ended_count(state: str, reason: str) -> float:
    labels = {"kind": OBSERVED.name, "state": state, "reason": reason}
    return REGISTRY.get_sample_value("outbox_action_ended_total", labels) or 0.0


def test_observers_hear_each_attempt_end_and_adapter_error_and_a_broken_one_changes_nothing(
    make_outbox, database_url, schema, caplog
):
    ob = make_outbox()
    ob.register(OBSERVED, ScriptedAdapter(script))
    ob.migrate()
    seen = Seen()
    ob.observers.insert(0, Broken())
    ob.observers.append(seen)
    with psycopg.connect(database_url) as conn:
        ids = [
            enqueue(
                conn,
                ActionRequest(
                    OBSERVED, workspace_id="w", lane_key=plan, idempotency_key=plan,
                    payload={"plan": plan},
                ),
                schema=schema,
            ).id
            for plan in ("retry-then-done", "raise", "expires")
        ]  # fmt: skip
        conn.execute(
            f"UPDATE \"{schema}\".agent_action SET expires_at = now() - interval '1 second'"
            " WHERE id = %s",
            (ids[2],),
        )
        conn.commit()
    done_before = ended_count("DONE", "DONE")
    with caplog.at_level(logging.ERROR, logger="outbox"):
        report = drain(ob)
    assert report.count() == {"retry": 1, "done": 1, "uncertain": 1}

    retried, raised, expired = ids
    by_action = {i: [e for e in seen.events if e[1] == i] for i in ids}
    assert by_action[retried] == [
        ("attempt", retried, "retry", True),
        ("attempt", retried, "done", True),
        ("ended", retried, "OBSERVED", "DONE", "DONE"),
    ]
    assert by_action[raised] == [
        ("error", raised, "ValueError", True),
        ("attempt", raised, "uncertain", True),
        ("ended", raised, "OBSERVED", "UNCERTAIN", "ADAPTER_ERROR_AFTER_WRITE"),
    ]
    assert by_action[expired] == [("ended", expired, "OBSERVED", "CANCELLED", "EXPIRED")]

    # The broken observer was logged and skipped: the finishes stand, the others still heard.
    with psycopg.connect(database_url) as conn:
        states = {r["id"]: r["state"] for r in rows(conn, schema)}
    assert states == {retried: "DONE", raised: "UNCERTAIN", expired: "CANCELLED"}
    assert ended_count("DONE", "DONE") == done_before + 1
    failures = [r for r in caplog.records if "observer" in r.getMessage()]
    assert failures and all(r.exc_info for r in failures)


def test_an_outbox_reports_to_metrics_then_logs_by_default():
    assert [type(o) for o in Outbox("postgresql://x@127.0.0.1/x").observers] == [
        MetricsObserver,
        LogObserver,
    ]
