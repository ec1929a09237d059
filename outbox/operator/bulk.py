"""The bulk forms of the operator's verbs: every action an ``ActionFilter`` matches that the
verb applies to. ``bulk_count`` says how many (``--dry-run``, the console's confirmation);
``bulk_apply`` applies the verb to each, one action a transaction (so a long bulk holds no lock
for long), and says how many it changed. An action that moved on between the two (a cancel whose
action was claimed meanwhile) is refused alone, by id."""

from __future__ import annotations

from typing import Any

from psycopg import Connection

from outbox._io import Operation, Statement, run_sync
from outbox.enqueuing import default_schema
from outbox.errors import ActionNotFound
from outbox.operator import actions
from outbox.operator.audit import audit_operation, checked_actor
from outbox.operator.errors import OperatorRefused
from outbox.operator.records import ActionFilter, BulkResult, BulkVerb, Outcome
from outbox.queries import queries_for

#: The states each verb applies to, whether it needs an unresolved action, and which link (a
#: resend or a retry already made) excludes one.
_VERB_SCOPE: dict[BulkVerb, tuple[tuple[str, ...], bool, str | None]] = {
    BulkVerb.RESOLVE_DELIVERED: (("UNCERTAIN",), True, None),
    BulkVerb.RESOLVE_NOT_DELIVERED: (("UNCERTAIN",), True, None),
    BulkVerb.RESEND: (("UNCERTAIN",), False, "RESEND"),
    BulkVerb.RETRY: (("FAILED", "CANCELLED"), False, "RETRY"),
    BulkVerb.CANCEL: (("PROPOSED", "ADMITTED"), False, None),
    BulkVerb.ADMIT: (("PROPOSED",), False, None),
    BulkVerb.REFUSE: (("PROPOSED",), False, None),
}


def _params(verb: BulkVerb, where: ActionFilter) -> dict[str, Any]:
    states, unresolved, unlinked = _VERB_SCOPE[verb]
    if where.states:
        states = tuple(s for s in states if s in {x.upper() for x in where.states})
    return {
        "states": list(states),
        "kinds": list(where.kinds),
        "reasons": list(where.reasons),
        "lanes": list(where.lanes),
        "created_from": where.created_from,
        "created_to": where.created_to,
        "ended_from": where.ended_from,
        "ended_to": where.ended_to,
        "unresolved": unresolved,
        # A resend of an action someone found DELIVERED is never made in bulk.
        "not_delivered_only": verb is BulkVerb.RESEND,
        "unlinked": unlinked,
        "limit": where.limit,
    }


def bulk_count(
    conn: Connection[Any], verb: BulkVerb | str, where: ActionFilter, *, schema: str | None = None
) -> int:
    """How many actions ``where`` matches that ``verb`` applies to now."""
    verb = BulkVerb(verb)

    # The ids themselves, counted here: the count is then by construction what an apply would
    # touch (one statement for both), and ``where.limit`` bounds the rows sent.
    return len(run_sync(conn, _matching_ids(schema or default_schema(), verb, where)))


def _matching_ids(schema: str, verb: BulkVerb, where: ActionFilter) -> Operation[list[int]]:
    rows = yield Statement(queries_for(schema)["bulk_matching_ids"], _params(verb, where))
    return [int(r["id"]) for r in rows]


def _apply_one(
    conn: Connection[Any],
    verb: BulkVerb,
    action_id: int,
    actor: str,
    note: str | None,
    schema: str,
) -> int | None:
    """Applies ``verb`` to one action; the id of a new action it made, if any."""
    match verb:
        case BulkVerb.RESOLVE_DELIVERED:
            actions.resolve(
                conn, action_id, Outcome.DELIVERED, actor=actor, note=note, schema=schema
            )
        case BulkVerb.RESOLVE_NOT_DELIVERED:
            actions.resolve(
                conn, action_id, Outcome.NOT_DELIVERED, actor=actor, note=note, schema=schema
            )
        case BulkVerb.RESEND:
            done = actions.resolve(
                conn,
                action_id,
                Outcome.NOT_DELIVERED,
                actor=actor,
                note=note,
                resend=True,
                schema=schema,
            )
            return done.resent.id if done.resent else None
        case BulkVerb.RETRY:
            return actions.retry(conn, action_id, actor=actor, schema=schema).id
        case BulkVerb.CANCEL:
            actions.cancel(conn, action_id, actor=actor, schema=schema)
        case BulkVerb.ADMIT:
            actions.admit(conn, action_id, actor=actor, schema=schema)
        case BulkVerb.REFUSE:
            actions.refuse(conn, action_id, actor=actor, reason=note, schema=schema)
    return None


def bulk_apply(
    conn: Connection[Any],
    verb: BulkVerb | str,
    where: ActionFilter,
    *,
    actor: str,
    note: str | None = None,
    schema: str | None = None,
) -> BulkResult:
    """Applies ``verb`` to every action ``where`` matches that it applies to, one transaction
    an action (``note`` is the resolutions' note, or the refusals' reason). Each is audited as
    the single verb would be, and the bulk as a whole once more (its filter and counts)."""
    verb = BulkVerb(verb)
    schema = schema or default_schema()
    actor = checked_actor(actor)
    ids = run_sync(conn, _matching_ids(schema, verb, where))
    applied = 0
    refused: dict[int, str] = {}
    new_ids: list[int] = []
    for action_id in ids:
        try:
            new_id = _apply_one(conn, verb, action_id, actor, note, schema)
        except (OperatorRefused, ActionNotFound) as error:
            refused[action_id] = str(error)
            continue
        applied += 1
        if new_id is not None:
            new_ids.append(new_id)
    detail = {
        "filter": where.as_dict(),
        "matched": len(ids),
        "applied": applied,
        "refused": len(refused),
        "note": note,
    }
    with conn.transaction():
        run_sync(conn, audit_operation(schema, actor, f"bulk-{verb.value}", detail=detail))
    return BulkResult(verb, len(ids), applied, refused, new_ids)
