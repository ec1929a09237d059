"""What an operator reads about one action: its attempts, its resolution, its links."""

from __future__ import annotations

from typing import Any

from psycopg import Connection

from outbox._io import Operation, Statement, run_sync
from outbox.action import Action
from outbox.enqueuing import default_schema
from outbox.errors import ActionNotFound
from outbox.operator.records import (
    ActionLink,
    ActionRecord,
    AttemptRecord,
    Outcome,
    Resolution,
)
from outbox.queries import queries_for


def _attempt(row: dict[str, Any], action_epoch: int, action_ended: bool) -> AttemptRecord:
    values = {k: row[k] for k in AttemptRecord.__dataclass_fields__ if k in row}
    # No result, and the action was claimed again or ended without this attempt's finish: its
    # worker died or stalled past its lease.
    lost = row["ended_at"] is None and (row["epoch"] < action_epoch or action_ended)
    lost = lost or (row["result"] is not None and row["reason"] in _LOST_REASONS)
    return AttemptRecord(**values, lost=lost)


#: Reasons housekeeping writes into an attempt it ended (its worker never finished it).
_LOST_REASONS = frozenset({"LEASE_LOST_AFTER_WRITE", "LEASE_EXPIRED"})


def attempts_operation(schema: str, action: Action) -> Operation[list[AttemptRecord]]:
    rows = yield Statement(queries_for(schema)["attempts_of_action"], {"id": action.id})
    return [_attempt(r, action.epoch, action.state.is_ended) for r in rows]


def resolution_operation(schema: str, action_id: int) -> Operation[Resolution | None]:
    rows = yield Statement(queries_for(schema)["resolution_of_action"], {"id": action_id})
    if not rows:
        return None
    row = rows[0]
    return Resolution(
        row["action_id"],
        Outcome(row["outcome"]),
        row["note"],
        row["resolved_by"],
        row["resolved_at"],
    )


def links_operation(
    schema: str, action_id: int
) -> Operation[tuple[list[ActionLink], list[ActionLink]]]:
    rows = yield Statement(queries_for(schema)["links_of_action"], {"id": action_id})
    links = [ActionLink(**r) for r in rows]
    return [x for x in links if x.to_id == action_id], [x for x in links if x.from_id == action_id]


def record_operation(
    schema: str, action_id: int, *, with_payload: bool = False
) -> Operation[ActionRecord]:
    q = queries_for(schema)
    rows = yield Statement(q["action_by_id"], {"id": action_id})
    if not rows:
        raise ActionNotFound(f"no action {action_id} (it may have been erased or pruned)")
    action = Action.from_row(rows[0] if with_payload else {**rows[0], "payload": None})
    attempts = yield from attempts_operation(schema, action)
    resolution = yield from resolution_operation(schema, action_id)
    earlier, later = yield from links_operation(schema, action_id)
    parked = yield Statement(q["parked_payload_exists"], {"id": action_id})
    return ActionRecord(action, attempts, resolution, earlier, later, bool(parked))


def attempts_of(
    conn: Connection[Any], action_id: int, *, schema: str | None = None
) -> list[AttemptRecord]:
    """Every attempt of an action on record, oldest first (empty for an action never taken;
    ``ActionNotFound`` when there is no such action)."""
    return action_record(conn, action_id, schema=schema).attempts


def resolution_of(
    conn: Connection[Any], action_id: int, *, schema: str | None = None
) -> Resolution | None:
    """The action's resolution, if a person recorded one."""
    return run_sync(conn, resolution_operation(schema or default_schema(), action_id))


def links_of(
    conn: Connection[Any], action_id: int, *, schema: str | None = None
) -> tuple[list[ActionLink], list[ActionLink]]:
    """``(earlier, later)``: the links that lead to this action (it is a resend or retry of
    ``from_id``) and those that lead from it (``to_id`` is its resend or retry)."""
    return run_sync(conn, links_operation(schema or default_schema(), action_id))


def action_record(
    conn: Connection[Any], action_id: int, *, schema: str | None = None, with_payload: bool = False
) -> ActionRecord:
    """The action (its payload only ``with_payload``), its attempts, resolution and links;
    ``ActionNotFound`` when there is no such action."""
    return run_sync(
        conn, record_operation(schema or default_schema(), action_id, with_payload=with_payload)
    )
