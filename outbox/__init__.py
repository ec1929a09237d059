"""outbox: carry out an application's effects on the outside world exactly as often as the
provider can tolerate, with PostgreSQL as the source of truth and Dramatiq as the fabric."""

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
