"""Dispatch: the claimer pushes messages of ``(action_id, epoch)`` pairs onto a fabric, one actor
(Dramatiq) or task (Celery, ``outbox.celery``) per kind runs them through the core executor.
See docs/dramatiq.md and docs/celery.md; ``fabric`` is the seam between the two."""

from outbox.dispatch.actors import Dispatch, install, installed
from outbox.dispatch.broker import DEFAULT_BROKER_URL, broker_from_url, default_broker
from outbox.dispatch.claimer import Claimer, run_claimer, run_claimer_async
from outbox.dispatch.fabric import Fabric
from outbox.dispatch.runtime import WorkerRuntime

__all__ = [
    "DEFAULT_BROKER_URL",
    "Claimer",
    "Dispatch",
    "Fabric",
    "WorkerRuntime",
    "broker_from_url",
    "default_broker",
    "install",
    "installed",
    "run_claimer",
    "run_claimer_async",
]
