"""Dispatch through Dramatiq: the claimer pushes messages of ``(action_id, epoch)`` pairs, one
actor per kind runs them through the core executor. See the README's "Running with Dramatiq"."""

from outbox.dispatch.actors import Dispatch, install, installed
from outbox.dispatch.broker import DEFAULT_BROKER_URL, broker_from_url, default_broker
from outbox.dispatch.claimer import Claimer, run_claimer, run_claimer_async
from outbox.dispatch.runtime import WorkerRuntime

__all__ = [
    "DEFAULT_BROKER_URL",
    "Claimer",
    "Dispatch",
    "WorkerRuntime",
    "broker_from_url",
    "default_broker",
    "install",
    "installed",
    "run_claimer",
    "run_claimer_async",
]
