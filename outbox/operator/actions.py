"""The operator's verbs on one action: resolve an UNCERTAIN one (and resend it), retry a FAILED
or CANCELLED one, cancel a waiting one, admit or refuse a proposal.

An ended action never changes (the guard trigger refuses it): a resolution is a row of its own,
and a resend or a retry is a new action in the same lane, linked to the old one
(``agent_action_link``), whose idempotency key is derived from the old action's id, so doing it
twice makes one new action. Its payload is the one parked when the old action ended
(``agent_action_parked_payload``), or one the caller supplies again.
"""

from __future__ import annotations

from typing import Any

from psycopg import Connection

from outbox._io import Operation, Statement, run_sync
from outbox.action import Action
from outbox.enqueuing import admit_operation, default_schema, enqueue_operation
from outbox.errors import ActionNotFound, IllegalTransition
from outbox.operator.audit import audit_operation, checked_actor, counted
from outbox.operator.errors import NothingToResend, OperatorRefused
from outbox.operator.records import Outcome, Resolution, ResolveResult
from outbox.queries import queries_for
from outbox.request import ActionRequest
from outbox.state import ActionState

#: The stop reason of an action an operator cancelled while it waited.
OPERATOR_CANCELLED = "OPERATOR_CANCELLED"
#: The stop reason of a proposal an operator refused without a reason of their own.
OPERATOR_REFUSED = "REFUSED"

_UNSET: Any = object()


def derived_idempotency_key(relation: str, action_id: int) -> str:
    """The idempotency key of the resend or retry of ``action_id``: one such action, whoever asks
    and however often."""
    return f"outbox:{relation.lower()}-of:{action_id}"


def _load(schema: str, action_id: int) -> Operation[Action]:
    rows = yield Statement(queries_for(schema)["action_by_id"], {"id": action_id})
    if not rows:
        raise ActionNotFound(f"no action {action_id} (it may have been erased or pruned)")
    return Action.from_row(rows[0])


def _refused(actor: str, verb: str, action: Action, message: str) -> OperatorRefused:
    counted(actor, verb, "refused", action_id=action.id, kind=action.kind)
    return OperatorRefused(message, action_id=action.id, state=action.state.value)


def _follow_up_operation(
    schema: str, old: Action, relation: str, actor: str, payload: Any
) -> Operation[tuple[Action, bool]]:
    """The new action that carries ``old`` out again (made once: its key is derived), linked
    to it; the parked payload, used or not, is dropped. Returns it and whether it is new."""
    q = queries_for(schema)
    key = derived_idempotency_key(relation, old.id)
    rows = yield Statement(q["action_by_idempotency_key"], {"idempotency_key": key})
    if rows:
        return Action.from_row(rows[0]), False
    if payload is _UNSET:
        parked = yield Statement(q["parked_payload_of"], {"id": old.id})
        if not parked:
            raise NothingToResend(
                f"action {old.id} keeps no payload to send again (it was dropped after the "
                "parked-payload retention, or the action ended before payloads were parked): "
                "enqueue it again from the application",
                action_id=old.id,
                state=old.state.value,
            )
        payload = parked[0]["payload"]
    request = ActionRequest(
        kind=old.kind,
        lane_key=old.lane_key,
        idempotency_key=key,
        payload=payload,
        workspace_id=old.workspace_id,
        subject_account_id=old.subject_account_id,
        max_attempts=old.max_attempts,
    )
    new = yield from enqueue_operation(schema, request)
    yield Statement(
        q["link_actions"],
        {"from_id": old.id, "to_id": new.id, "relation": relation, "actor": actor},
    )
    yield Statement(q["drop_parked_payload"], {"id": old.id})
    return new, new.created


def resolve(
    conn: Connection[Any],
    action_id: int,
    outcome: Outcome | str,
    *,
    actor: str,
    note: str | None = None,
    resend: bool = False,
    payload: Any = _UNSET,
    schema: str | None = None,
) -> ResolveResult:
    """Records what a person found out about an UNCERTAIN action: ``Outcome.DELIVERED`` or
    ``NOT_DELIVERED``, with a note. The action row never changes; the resolution is its own
    record (who, when, what, note).

    ``resend`` (only with NOT_DELIVERED) enqueues a new action in the same lane with a derived
    idempotency key, linked to this one; its payload is the parked one, or ``payload``.
    Resolving again with the same outcome changes nothing (and resends nothing new); with the
    other outcome, or on an action that is not UNCERTAIN, it raises ``OperatorRefused``.
    """
    schema = schema or default_schema()
    actor = checked_actor(actor)
    outcome = Outcome(outcome)
    if resend and outcome is not Outcome.NOT_DELIVERED:
        raise ValueError("a resend follows only a NOT_DELIVERED resolution")

    def op() -> Operation[ResolveResult]:
        q = queries_for(schema)
        action = yield from _load(schema, action_id)
        if action.state is not ActionState.UNCERTAIN:
            raise _refused(
                actor,
                "resolve",
                action,
                f"action {action_id} is {action.state}, not UNCERTAIN: only an UNCERTAIN action "
                "is resolved (retry a FAILED or CANCELLED one)",
            )
        params = {"id": action_id, "outcome": outcome.value, "note": note, "actor": actor}
        rows = yield Statement(q["resolve_action"], params)
        created = bool(rows)
        if not rows:
            rows = yield Statement(q["resolution_of_action"], {"id": action_id})
            if rows[0]["outcome"] != outcome.value:
                raise _refused(
                    actor,
                    "resolve",
                    action,
                    f"action {action_id} was already resolved {rows[0]['outcome']} by "
                    f"{rows[0]['resolved_by']} at {rows[0]['resolved_at']:%Y-%m-%d %H:%M:%S %Z}",
                )
        row = rows[0]
        resolution = Resolution(
            row["action_id"],
            Outcome(row["outcome"]),
            row["note"],
            row["resolved_by"],
            row["resolved_at"],
        )
        resent: Action | None = None
        resent_new = False
        if resend:
            resent, resent_new = yield from _follow_up_operation(
                schema, action, "RESEND", actor, payload
            )
        elif outcome is Outcome.DELIVERED:
            yield Statement(q["drop_parked_payload"], {"id": action_id})
        yield from audit_operation(
            schema,
            actor,
            "resolve",
            action_id=action_id,
            kind=action.kind,
            outcome="applied" if created or resent_new else "unchanged",
            detail={
                "outcome": outcome.value,
                "note": note,
                "resent_id": resent.id if resent else None,
            },
        )
        return ResolveResult(resolution, resent, created)

    with conn.transaction():
        return run_sync(conn, op())


def retry(
    conn: Connection[Any],
    action_id: int,
    *,
    actor: str,
    payload: Any = _UNSET,
    schema: str | None = None,
) -> Action:
    """A new action carrying a FAILED or CANCELLED one out again, in the same lane, with a
    derived idempotency key and linked to it (RETRY); its payload is the parked one, or
    ``payload``. Retrying twice returns the same new action. ``OperatorRefused`` for any other
    state; ``NothingToResend`` when no payload is kept and none is given."""
    schema = schema or default_schema()
    actor = checked_actor(actor)

    def op() -> Operation[Action]:
        action = yield from _load(schema, action_id)
        if action.state not in (ActionState.FAILED, ActionState.CANCELLED):
            raise _refused(
                actor,
                "retry",
                action,
                f"action {action_id} is {action.state}: only a FAILED or CANCELLED action is "
                "retried (resolve an UNCERTAIN one, with --resend to send it again)",
            )
        new, created = yield from _follow_up_operation(schema, action, "RETRY", actor, payload)
        yield from audit_operation(
            schema,
            actor,
            "retry",
            action_id=action_id,
            kind=action.kind,
            outcome="applied" if created else "unchanged",
            detail={"new_id": new.id},
        )
        return new

    with conn.transaction():
        return run_sync(conn, op())


def _end_waiting_operation(
    schema: str, action_id: int, actor: str, verb: str, states: tuple[str, ...], reason: str
) -> Operation[Action]:
    """Ends a waiting action CANCELLED with ``reason``, its payload parked. A claimer that holds
    the row makes this wait for its claim to commit, and then find it EXECUTING (refused); a
    claim that comes after finds it CANCELLED: one of the two, never both."""
    q = queries_for(schema)
    rows = yield Statement(
        q["operator_end_waiting"], {"id": action_id, "states": list(states), "reason": reason}
    )
    if rows:
        action = Action.from_row(rows[0])
        yield from audit_operation(
            schema, actor, verb, action_id=action_id, kind=action.kind, detail={"reason": reason}
        )
        return action
    action = yield from _load(schema, action_id)
    raise _refused(
        actor,
        verb,
        action,
        f"action {action_id} is {action.state}, not {' or '.join(states)}"
        + (
            ": it is running; it ends by its own result"
            if action.state is ActionState.EXECUTING
            else ""
        ),
    )


def cancel(
    conn: Connection[Any], action_id: int, *, actor: str, schema: str | None = None
) -> Action:
    """Ends a waiting (PROPOSED or ADMITTED) action CANCELLED ``OPERATOR_CANCELLED``; its payload
    is parked for a retry. Refused (``OperatorRefused``) once it is executing or ended: a claim
    and a cancel never both happen."""
    schema = schema or default_schema()
    actor = checked_actor(actor)
    op = _end_waiting_operation(
        schema, action_id, actor, "cancel", ("PROPOSED", "ADMITTED"), OPERATOR_CANCELLED
    )
    with conn.transaction():
        return run_sync(conn, op)


def admit(
    conn: Connection[Any], action_id: int, *, actor: str, schema: str | None = None
) -> Action:
    """Admits a proposal (PROPOSED becomes ADMITTED, due now); ``OperatorRefused`` otherwise."""
    schema = schema or default_schema()
    actor = checked_actor(actor)

    def op() -> Operation[Action]:
        try:
            action = yield from admit_operation(schema, action_id)
        except IllegalTransition as error:
            counted(actor, "admit", "refused", action_id=action_id)
            raise OperatorRefused(str(error), action_id=action_id) from error
        yield from audit_operation(schema, actor, "admit", action_id=action_id, kind=action.kind)
        return action

    with conn.transaction():
        return run_sync(conn, op())


def refuse(
    conn: Connection[Any],
    action_id: int,
    *,
    actor: str,
    reason: str | None = None,
    schema: str | None = None,
) -> Action:
    """Refuses a proposal: it ends CANCELLED with ``reason`` (``REFUSED`` by default), its payload
    parked for a retry; ``OperatorRefused`` when it is not PROPOSED."""
    schema = schema or default_schema()
    actor = checked_actor(actor)
    op = _end_waiting_operation(
        schema, action_id, actor, "refuse", ("PROPOSED",), reason or OPERATOR_REFUSED
    )
    with conn.transaction():
        return run_sync(conn, op)
