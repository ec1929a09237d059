"""Enqueue, admit and refuse: on the caller's connection, inside the caller's transaction.

Nothing here commits. Each operation is written once (see ``outbox._io``) and offered sync and
async.
"""

from __future__ import annotations

import os
from typing import Any

from psycopg import AsyncConnection
from psycopg.types.json import Jsonb

from outbox._io import Operation, Statement, psycopg_connection, run_async, run_sync
from outbox.action import Action
from outbox.errors import ActionNotFound, IllegalTransition, InvalidActionRequest, UnknownKindError
from outbox.queries import queries_for
from outbox.request import ActionRequest, as_text
from outbox.state import ActionState, StopReason

#: The schema used when a call names none: ``OUTBOX_SCHEMA`` or ``outbox``.
DEFAULT_SCHEMA = "outbox"


def default_schema() -> str:
    return os.environ.get("OUTBOX_SCHEMA", DEFAULT_SCHEMA)


def enqueue_operation(schema: str, request: ActionRequest) -> Operation[Action]:
    request.validate()
    q = queries_for(schema)
    params = {
        "kind": request.kind_name,
        "state": (ActionState.PROPOSED if request.proposal else ActionState.ADMITTED).value,
        "workspace_id": as_text(request.workspace_id),
        "lane_key": request.lane_key,
        "idempotency_key": request.idempotency_key,
        "payload": Jsonb(request.payload),
        "subject_account_id": as_text(request.subject_account_id),
        "max_attempts": request.max_attempts,
        "expires_at": request.expires_at,
    }
    rows = yield Statement(q["enqueue"], params)
    if rows:
        return Action.from_row(rows[0])
    # Nothing inserted: either the key exists (a racing insert has committed by now, since
    # ON CONFLICT waited for it), or the request was refused by the kind table or the clock.
    rows = yield Statement(q["action_by_idempotency_key"], params)
    if rows:
        return Action.from_row(rows[0])
    rows = yield Statement(q["enqueue_diagnose"], params)
    instance_level, db_now = rows[0]["instance_level"], rows[0]["db_now"]
    if instance_level is None:
        raise UnknownKindError(request.kind_name)
    if request.workspace_id is None and not instance_level:
        raise InvalidActionRequest(
            "workspace_id", f"kind {request.kind_name} is not instance-level: give a workspace"
        )
    if request.expires_at is not None and request.expires_at <= db_now:
        raise InvalidActionRequest("expires_at", f"{request.expires_at} has already passed")
    raise InvalidActionRequest("idempotency_key", "the action vanished while enqueueing; retry")


def _proposal_operation(schema: str, name: str, params: dict[str, Any]) -> Operation[Action]:
    q = queries_for(schema)
    rows = yield Statement(q[name], params)
    if rows:
        return Action.from_row(rows[0])
    rows = yield Statement(q["action_by_id"], params)
    if not rows:
        raise ActionNotFound(f"no action {params['id']}")
    state = rows[0]["state"]
    raise IllegalTransition(f"action {params['id']} is {state}, not PROPOSED")


def admit_operation(schema: str, action_id: int) -> Operation[Action]:
    return _proposal_operation(schema, "admit", {"id": action_id})


def refuse_operation(schema: str, action_id: int, reason: str | None) -> Operation[Action]:
    return _proposal_operation(
        schema, "refuse", {"id": action_id, "reason": reason or StopReason.REFUSED}
    )


def get_operation(schema: str, action_id: int) -> Operation[Action | None]:
    rows = yield Statement(queries_for(schema)["action_by_id"], {"id": action_id})
    return Action.from_row(rows[0]) if rows else None


def enqueue(conn: Any, request: ActionRequest, *, schema: str | None = None) -> Action:
    """Record ``request`` in the caller's transaction and return its action.

    A second enqueue with the same idempotency key returns the first action and changes nothing,
    also when two transactions race (the second waits for the first to commit or roll back).
    ``conn`` is a psycopg ``Connection`` or a SQLAlchemy ``Session``/``Connection`` on psycopg.
    Raises ``InvalidActionRequest`` (naming the field) and writes nothing on bad input.
    """
    op = enqueue_operation(schema or default_schema(), request)
    return run_sync(psycopg_connection(conn), op)


async def enqueue_async(
    conn: AsyncConnection[Any], request: ActionRequest, *, schema: str | None = None
) -> Action:
    """The async twin of ``enqueue``."""
    return await run_async(conn, enqueue_operation(schema or default_schema(), request))


def admit(conn: Any, action_id: int, *, schema: str | None = None) -> Action:
    """A PROPOSED action becomes ADMITTED (due now)."""
    return run_sync(
        psycopg_connection(conn), admit_operation(schema or default_schema(), action_id)
    )


async def admit_async(
    conn: AsyncConnection[Any], action_id: int, *, schema: str | None = None
) -> Action:
    return await run_async(conn, admit_operation(schema or default_schema(), action_id))


def refuse(
    conn: Any, action_id: int, reason: str | None = None, *, schema: str | None = None
) -> Action:
    """A PROPOSED action ends CANCELLED with ``reason`` (``REFUSED`` by default)."""
    op = refuse_operation(schema or default_schema(), action_id, reason)
    return run_sync(psycopg_connection(conn), op)


async def refuse_async(
    conn: AsyncConnection[Any],
    action_id: int,
    reason: str | None = None,
    *,
    schema: str | None = None,
) -> Action:
    return await run_async(conn, refuse_operation(schema or default_schema(), action_id, reason))


def get_action(conn: Any, action_id: int, *, schema: str | None = None) -> Action | None:
    """One action by id, or None when it does not exist (erased, pruned, never was)."""
    return run_sync(psycopg_connection(conn), get_operation(schema or default_schema(), action_id))
