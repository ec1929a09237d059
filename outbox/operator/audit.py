"""Every operator action on record three ways: a row of ``outbox_operator_audit`` (in the same
transaction as the change it records), a log line naming who did it, and the Prometheus counter
``outbox_operator_actions_total{verb, outcome}``. A refusal changes nothing and writes no row,
but is logged and counted."""

from __future__ import annotations

import getpass
import logging
from typing import Any

from prometheus_client import Counter
from psycopg import Connection
from psycopg.types.json import Jsonb

from outbox._io import Operation, Statement, run_sync
from outbox.enqueuing import default_schema
from outbox.operator.records import AuditRecord
from outbox.queries import queries_for

log = logging.getLogger("outbox.operator")

OPERATOR_ACTIONS = Counter(
    "outbox_operator_actions",
    "Operator actions by verb (resolve, retry, cancel, admit, refuse, pause, resume, bulk-*) "
    "and outcome (applied, unchanged, refused)",
    ["verb", "outcome"],
)

#: Longest actor name kept (a console login or an OS user; longer ones are cut).
MAX_ACTOR = 200


def default_actor() -> str:
    """The OS user running this process (the CLI's default for ``--as``)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def checked_actor(actor: str) -> str:
    """An actor name as it is stored: stripped, non-empty, at most ``MAX_ACTOR`` characters."""
    name = (actor or "").strip().replace("\x00", "")
    if not name:
        raise ValueError("an operator action needs an actor (who is doing it)")
    return name[:MAX_ACTOR]


def audit_operation(
    schema: str,
    actor: str,
    verb: str,
    *,
    action_id: int | None = None,
    kind: str | None = None,
    outcome: str = "applied",
    detail: dict[str, Any] | None = None,
) -> Operation[None]:
    """Writes the audit row; then logs and counts (the caller's transaction commits it)."""
    params = {
        "actor": actor,
        "verb": verb,
        "action_id": action_id,
        "kind": kind,
        "outcome": outcome,
        "detail": Jsonb(detail) if detail is not None else None,
    }
    yield Statement(queries_for(schema)["operator_audit_insert"], params)
    counted(actor, verb, outcome, action_id=action_id, kind=kind)


def counted(
    actor: str, verb: str, outcome: str, *, action_id: int | None = None, kind: str | None = None
) -> None:
    """Logs and counts one operator action (also a refusal, which writes no audit row)."""
    OPERATOR_ACTIONS.labels(verb, outcome).inc()
    log.info(
        "%s by %s: %s%s",
        verb,
        actor,
        outcome,
        f" (action {action_id})" if action_id is not None else f" (kind {kind})" if kind else "",
        extra={
            "event": "operator_action",
            "actor": actor,
            "verb": verb,
            "outcome": outcome,
            "action_id": action_id,
            "kind": kind,
        },
    )


def recent_audit(
    conn: Connection[Any],
    *,
    action_id: int | None = None,
    limit: int = 50,
    schema: str | None = None,
) -> list[AuditRecord]:
    """The latest operator actions, newest first (only those on ``action_id`` if given)."""

    def op() -> Operation[list[AuditRecord]]:
        rows = yield Statement(
            queries_for(schema or default_schema())["operator_audit_recent"],
            {"action_id": action_id, "limit": limit},
        )
        return [AuditRecord(**r) for r in rows]

    return run_sync(conn, op())
