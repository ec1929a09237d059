"""The operator's verbs as a service layer: what ``outbox resolve``, ``retry``, ``cancel``,
``admit``, ``refuse``, ``pause`` and ``resume`` do, their bulk forms, and what an operator reads
(an action's attempts, resolution and links; paused kinds; live processes; the audit).

Every function takes a sync psycopg ``Connection`` and, when it changes something, an
``actor`` (who did it: the console's login, ``--as``, or the OS user). A function that changes
something runs in ``conn.transaction()``: atomic on an autocommit connection, a savepoint inside
the caller's transaction otherwise (the caller then commits). Nothing here knows of a web
framework; the CLI and the console both call these.
"""

from __future__ import annotations

from outbox.operator.actions import admit, cancel, refuse, resolve, retry
from outbox.operator.audit import recent_audit
from outbox.operator.bulk import bulk_apply, bulk_count
from outbox.operator.errors import NothingToResend, OperatorRefused
from outbox.operator.pausing import pause, paused_kinds, resume
from outbox.operator.processes import live_processes
from outbox.operator.reading import action_record, attempts_of, links_of, resolution_of
from outbox.operator.records import (
    ActionFilter,
    ActionLink,
    ActionRecord,
    AttemptRecord,
    AuditRecord,
    BulkResult,
    BulkVerb,
    KindPause,
    LiveProcess,
    Outcome,
    Resolution,
    ResolveResult,
)

__all__ = [
    "ActionFilter",
    "ActionLink",
    "ActionRecord",
    "AttemptRecord",
    "AuditRecord",
    "BulkResult",
    "BulkVerb",
    "KindPause",
    "LiveProcess",
    "NothingToResend",
    "OperatorRefused",
    "Outcome",
    "Resolution",
    "ResolveResult",
    "action_record",
    "admit",
    "attempts_of",
    "bulk_apply",
    "bulk_count",
    "cancel",
    "links_of",
    "live_processes",
    "pause",
    "paused_kinds",
    "recent_audit",
    "refuse",
    "resolution_of",
    "resolve",
    "resume",
    "retry",
]
