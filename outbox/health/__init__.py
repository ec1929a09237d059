"""Liveness and readiness of the claimer and the worker pool (docs/operations.md, "Health")."""

from outbox.health.probe import role_verdict, role_verdicts, start_health_server
from outbox.health.state import HealthFile, ProcessHealth, Verdict, judge, process_health

__all__ = [
    "HealthFile",
    "ProcessHealth",
    "Verdict",
    "judge",
    "process_health",
    "role_verdict",
    "role_verdicts",
    "start_health_server",
]
