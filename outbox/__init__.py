"""outbox: carry out an application's effects on the outside world exactly as often as the
provider can tolerate, with PostgreSQL as the source of truth and Dramatiq as the fabric."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outbox.action import Action
    from outbox.adapter import ActionAdapter
    from outbox.attempt import ActionAttempt, Fence
    from outbox.config import Settings
    from outbox.email import EmailAdapter, EmailNotice, enqueue_email
    from outbox.enqueuing import (
        admit,
        admit_async,
        enqueue,
        enqueue_async,
        enqueue_many,
        enqueue_many_async,
        get_action,
        refuse,
        refuse_async,
    )
    from outbox.erasure import ErasureReport, erase_subject, erase_subject_async
    from outbox.errors import (
        ActionNotFound,
        AdapterAlreadyRegistered,
        ConfigurationError,
        DrainDidNotSettle,
        IllegalTransition,
        InvalidActionRequest,
        KindConflictError,
        OutboxError,
        TransactionOpenError,
        UnknownKindError,
        UnusableConnection,
    )
    from outbox.executor import ActionExecutor, Outcome
    from outbox.fence_token import FenceToken
    from outbox.kinds import EMAIL, ActionKind
    from outbox.observers import ExecutorObserver
    from outbox.outbox import Outbox
    from outbox.request import ActionRequest
    from outbox.results import (
        Abandoned,
        Cancelled,
        Defer,
        Done,
        Failed,
        Finish,
        Result,
        Retry,
        Uncertain,
        finish_for,
    )
    from outbox.state import ActionState, StopReason

#: Each public name and the module that defines it. The package imports a module when one of its
#: names is first used, not when ``outbox`` is imported: a command that needs none of them (``outbox
#: health``, the probe a container runs every few seconds) then starts without loading psycopg,
#: Dramatiq, Prometheus and the adapters. ``from outbox import X`` and ``outbox.X`` work as before.
_PUBLIC = {
    "Action": "outbox.action",
    "ActionAdapter": "outbox.adapter",
    "ActionAttempt": "outbox.attempt",
    "Fence": "outbox.attempt",
    "Settings": "outbox.config",
    "EmailAdapter": "outbox.email",
    "EmailNotice": "outbox.email",
    "enqueue_email": "outbox.email",
    "admit": "outbox.enqueuing",
    "admit_async": "outbox.enqueuing",
    "enqueue": "outbox.enqueuing",
    "enqueue_async": "outbox.enqueuing",
    "enqueue_many": "outbox.enqueuing",
    "enqueue_many_async": "outbox.enqueuing",
    "get_action": "outbox.enqueuing",
    "refuse": "outbox.enqueuing",
    "refuse_async": "outbox.enqueuing",
    "ErasureReport": "outbox.erasure",
    "erase_subject": "outbox.erasure",
    "erase_subject_async": "outbox.erasure",
    "ActionNotFound": "outbox.errors",
    "AdapterAlreadyRegistered": "outbox.errors",
    "ConfigurationError": "outbox.errors",
    "DrainDidNotSettle": "outbox.errors",
    "IllegalTransition": "outbox.errors",
    "InvalidActionRequest": "outbox.errors",
    "KindConflictError": "outbox.errors",
    "OutboxError": "outbox.errors",
    "TransactionOpenError": "outbox.errors",
    "UnknownKindError": "outbox.errors",
    "UnusableConnection": "outbox.errors",
    "ActionExecutor": "outbox.executor",
    "Outcome": "outbox.executor",
    "FenceToken": "outbox.fence_token",
    "ActionKind": "outbox.kinds",
    "EMAIL": "outbox.kinds",
    "ExecutorObserver": "outbox.observers",
    "Outbox": "outbox.outbox",
    "ActionRequest": "outbox.request",
    "Abandoned": "outbox.results",
    "Cancelled": "outbox.results",
    "Defer": "outbox.results",
    "Done": "outbox.results",
    "Failed": "outbox.results",
    "Finish": "outbox.results",
    "Result": "outbox.results",
    "Retry": "outbox.results",
    "Uncertain": "outbox.results",
    "finish_for": "outbox.results",
    "ActionState": "outbox.state",
    "StopReason": "outbox.state",
}


def __getattr__(name: str) -> Any:
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'outbox' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # the next lookup finds it without this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))


__all__ = [
    "EMAIL",
    "Abandoned",
    "Action",
    "ActionAdapter",
    "ActionAttempt",
    "ActionExecutor",
    "ActionKind",
    "ActionNotFound",
    "ActionRequest",
    "ActionState",
    "AdapterAlreadyRegistered",
    "Cancelled",
    "ConfigurationError",
    "Defer",
    "Done",
    "DrainDidNotSettle",
    "EmailAdapter",
    "EmailNotice",
    "ErasureReport",
    "ExecutorObserver",
    "Failed",
    "Fence",
    "FenceToken",
    "Finish",
    "IllegalTransition",
    "InvalidActionRequest",
    "KindConflictError",
    "Outbox",
    "OutboxError",
    "Outcome",
    "Result",
    "Retry",
    "Settings",
    "StopReason",
    "TransactionOpenError",
    "Uncertain",
    "UnknownKindError",
    "UnusableConnection",
    "admit",
    "admit_async",
    "enqueue",
    "enqueue_async",
    "enqueue_email",
    "enqueue_many",
    "enqueue_many_async",
    "erase_subject",
    "erase_subject_async",
    "finish_for",
    "get_action",
    "refuse",
    "refuse_async",
]
