"""Prometheus counters of attempts and ends (names and labels are part of the contract)."""

from __future__ import annotations

from prometheus_client import Counter

ATTEMPTS = Counter(
    "outbox_action_attempts",
    "Attempts by kind, result (done, retry, defer, uncertain, failed, cancelled, abandoned) and "
    "whether the fenced finish was recorded",
    ["kind", "result", "recorded"],
)
ENDED = Counter(
    "outbox_action_ended",
    "Actions that ended, by kind, final state and stop reason",
    ["kind", "state", "reason"],
)


def record_attempt(kind: str, result: str, recorded: bool) -> None:
    ATTEMPTS.labels(kind=kind, result=result, recorded=str(recorded).lower()).inc()


def record_ended(kind: str, state: str, reason: str) -> None:
    ENDED.labels(kind=kind, state=state, reason=reason).inc()
