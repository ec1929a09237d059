"""Enqueue, admit and refuse: on the caller's connection, inside the caller's transaction.

Nothing here commits. Each operation is written once (see ``outbox._io``) and offered sync and
async.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from itertools import repeat
from typing import Any

from psycopg.types.json import Jsonb

from outbox._io import Operation, Statement
from outbox.action import Action, created_action
from outbox.config import max_payload_bytes_from_env
from outbox.connectors import run_async_on, run_sync_on
from outbox.errors import ActionNotFound, IllegalTransition, InvalidActionRequest, UnknownKindError
from outbox.queries import queries_for
from outbox.request import ActionRequest, as_text
from outbox.request_checks import utc
from outbox.state import ActionState, StopReason

#: The schema used when a call names none: ``OUTBOX_SCHEMA`` or ``outbox``.
DEFAULT_SCHEMA = "outbox"


def default_schema() -> str:
    return os.environ.get("OUTBOX_SCHEMA", DEFAULT_SCHEMA)


def max_payload_bytes_or_default(max_payload_bytes: int | None) -> int:
    """The limit given, else ``OUTBOX_MAX_PAYLOAD_BYTES``, else the default (64 KiB)."""
    return max_payload_bytes_from_env() if max_payload_bytes is None else max_payload_bytes


def _already_encoded(data: str) -> str:
    """The payload's JSON was encoded (and checked) by ``ActionRequest.checked``."""
    return data


def _state(request: ActionRequest) -> ActionState:
    """A new action's state: PROPOSED for a proposal (it waits to be admitted), else ADMITTED."""
    return ActionState.PROPOSED if request.proposal else ActionState.ADMITTED


def _params(request: ActionRequest, payload: str) -> dict[str, Any]:
    """One request as the ``enqueue`` statement's parameters; ``payload`` is its JSON."""
    return {
        "kind": request.kind_name,
        "state": _state(request).value,
        "workspace_id": as_text(request.workspace_id),
        "lane_key": request.lane_key,
        "idempotency_key": request.idempotency_key,
        "payload": Jsonb(payload, dumps=_already_encoded),
        "subject_account_id": as_text(request.subject_account_id),
        "max_attempts": request.max_attempts,
        "expires_at": utc(request.expires_at),
        "not_before": utc(request.not_before),
        "priority": request.priority,
        "limit_key": as_text(request.limit_key),
    }


#: A request as its row stores it, in ``created_action``'s order after the values the database
#: makes (id, available_at, created_at): the payload (its checked copy), kind, state,
#: workspace_id, lane_key, idempotency_key, subject_account_id, max_attempts, expires_at (in
#: UTC), priority, limit_key. The action an insert made of the request is
#: ``created_action(id, available_at, created_at, *stored)``: the statement returns only what the
#: database made (the id and the clock times), the rest is the request as the row stores it and
#: the payload the value its JSON decodes to, so no row is read back whole.
_Stored = tuple[
    Any, str, ActionState, str | None, str, str, str | None, int, datetime | None, int, str | None
]


def _stored(request: ActionRequest, payload: Any) -> _Stored:
    """Made once a request: a batch's document and the action returned are both made of it."""
    return (
        payload,
        request.kind_name,
        _state(request),
        as_text(request.workspace_id),
        request.lane_key,
        request.idempotency_key,
        as_text(request.subject_account_id),
        request.max_attempts,
        utc(request.expires_at),
        request.priority,
        as_text(request.limit_key),
    )


def _stamp(value: datetime | None) -> str | None:
    return None if value is None else value.astimezone(UTC).isoformat()


_BATCH_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))


def _document(
    stored: Sequence[_Stored], not_before: Sequence[datetime | None], payloads: Sequence[str]
) -> str:
    """The ``enqueue_many`` statement's one parameter: the batch as a JSON object of columns,
    one array a field in request order (``payloads``: each request's checked JSON, spliced in
    as it is). One document, parsed by the server, instead of a dozen arrays the driver would
    encode element by element."""
    # The columns, by turning the requests' rows over (``zip``, in C); a state (a StrEnum) is
    # written as its text.
    (
        _,
        kinds,
        states,
        workspace_ids,
        lane_keys,
        keys,
        subject_account_ids,
        max_attempts,
        expires_at,
        priorities,
        limit_keys,
    ) = zip(*stored, strict=True) if stored else ((),) * 11
    columns: dict[str, Sequence[Any]] = {
        "kind": kinds,
        "state": states,
        "lane_key": lane_keys,
        "idempotency_key": keys,
        "max_attempts": max_attempts,
        "priority": priorities,
    }
    # A column whose every value is null is left out (the statement reads a missing column as
    # nulls): the common batch gives none of these.
    optional = (
        ("workspace_id", workspace_ids),
        ("subject_account_id", subject_account_ids),
        ("expires_at", expires_at),
        ("not_before", not_before),
        ("limit_key", limit_keys),
    )
    for name, values in optional:
        if values.count(None) < len(values):
            times = name in ("expires_at", "not_before")
            columns[name] = [_stamp(value) for value in values] if times else values
    return '{"payload":[' + ",".join(payloads) + "]," + _BATCH_JSON.encode(columns)[1:]


def _refusal(
    request: ActionRequest, instance_level: bool | None, db_now: datetime
) -> InvalidActionRequest | None:
    """Why the database refused ``request`` (None when it would not have): the kind table and
    the database clock say, as ``enqueue_diagnose`` reads them. Written once so that ``enqueue``
    and ``enqueue_many`` raise the same error for the same request."""
    if instance_level is None:
        return UnknownKindError(request.kind_name)
    if request.workspace_id is None and not instance_level:
        return InvalidActionRequest(
            "workspace_id", f"kind {request.kind_name} is not instance-level: give a workspace"
        )
    if request.expires_at is not None and request.expires_at <= db_now:
        return InvalidActionRequest("expires_at", f"{request.expires_at} has already passed")
    return None


def _vanished() -> InvalidActionRequest:
    return InvalidActionRequest("idempotency_key", "the action vanished while enqueueing; retry")


def enqueue_operation(
    schema: str, request: ActionRequest, max_payload_bytes: int | None = None
) -> Operation[Action]:
    text, payload = request.checked(max_payload_bytes_or_default(max_payload_bytes))
    q = queries_for(schema)
    params = _params(request, text)
    rows = yield Statement(q["enqueue"], params, tuples=True)
    if rows:
        id_, available_at, created_at = rows[0]
        return created_action(id_, available_at, created_at, *_stored(request, payload))
    # Nothing inserted: either the key exists (a racing insert has committed by now, since
    # ON CONFLICT waited for it), or the request was refused by the kind table or the clock.
    rows = yield Statement(q["action_by_idempotency_key"], params)
    if rows:
        return Action.from_row(rows[0])
    rows = yield Statement(q["enqueue_diagnose"], params)
    raise _refusal(request, rows[0]["instance_level"], rows[0]["db_now"]) or _vanished()


#: How often ``enqueue_many`` inserts again when its batch was held back by a request that a
#: racing transaction then made acceptable (it committed that request's key): each retry needs
#: another commit to land between two statements of this one call, so a few are plenty.
_ENQUEUE_MANY_TRIES = 3


def enqueue_many_operation(
    schema: str, requests: Iterable[ActionRequest], max_payload_bytes: int | None = None
) -> Operation[list[Action]]:
    """``enqueue`` of each request in order, as one insert statement for the whole batch.

    Only the first request of each idempotency key is sent: a later one with the same key gets
    that action back (``created`` False), as a second ``enqueue`` would. The statement inserts
    nothing when any new key's request is refused, so a refusal leaves nothing half-written and
    no SQL error in the caller's transaction; the keys it did not insert are then read in one
    statement (existing keys, and keys a racing transaction committed while we waited). Every
    request is checked before any SQL; a refusal names the request's position (``index``).
    """
    batch = list(requests)
    limit = max_payload_bytes_or_default(max_payload_bytes)
    checked: list[tuple[str, Any]] = []
    # The position of the first request of each key.
    firsts: dict[str, int] = {}
    for index, request in enumerate(batch):
        try:
            checked.append(request.checked(limit))
        except InvalidActionRequest as error:
            raise error.for_request(index) from None
        firsts.setdefault(request.idempotency_key, index)
    if not batch:
        return []
    q = queries_for(schema)
    stored = {key: _stored(batch[index], checked[index][1]) for key, index in firsts.items()}
    document = _document(
        list(stored.values()),
        [batch[index].not_before for index in firsts.values()],
        [checked[index][0] for index in firsts.values()],
    )
    params = {"requests": document}
    found: dict[str, Action] = {}
    for _ in range(_ENQUEUE_MANY_TRIES):
        rows = yield Statement(q["enqueue_many"], params)
        for made in rows:  # one row, or none when nothing was inserted
            created_at = made["created_at"]
            later = made["later"] or repeat(None)
            for id_, key, due in zip(made["ids"], made["keys"], later, strict=False):
                found[key] = created_action(id_, due or created_at, created_at, *stored[key])
        missing = [key for key in firsts if key not in found]
        if not missing:
            break
        rows = yield Statement(q["actions_by_idempotency_keys"], {"idempotency_keys": missing})
        found.update((row["idempotency_key"], Action.from_row(row)) for row in rows)
        missing = [key for key in missing if key not in found]
        if not missing:
            break
        # Some new key was refused (the whole batch then inserted nothing): the first refused
        # request in order raises what ``enqueue`` would have raised for it.
        kinds = list(dict.fromkeys(batch[firsts[key]].kind_name for key in missing))
        rows = yield Statement(q["enqueue_many_diagnose"], {"kinds": kinds})
        instance_level = {row["kind"]: row["instance_level"] for row in rows}
        db_now = rows[0]["db_now"]
        for key in missing:
            index = firsts[key]
            request = batch[index]
            refusal = _refusal(request, instance_level[request.kind_name], db_now)
            if refusal is not None:
                raise refusal.for_request(index)
        # None is refused now: a racing transaction committed the refused request's key after
        # our insert looked (or an action vanished); the batch is acceptable, so insert again.
    else:
        raise _vanished()
    if len(firsts) == len(batch):  # no key repeated (the common batch): firsts is the batch
        return [found[key] for key in firsts]
    actions: list[Action] = []
    seen: set[str] = set()
    for request in batch:
        action = found[request.idempotency_key]
        if request.idempotency_key in seen and action.created:
            action = replace(action, created=False)  # a repeat finds the first's action
        seen.add(request.idempotency_key)
        actions.append(action)
    return actions


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


def enqueue(
    conn: Any,
    request: ActionRequest,
    *,
    schema: str | None = None,
    max_payload_bytes: int | None = None,
) -> Action:
    """Record ``request`` in the caller's transaction and return its action.

    A second enqueue with the same idempotency key returns the first action and changes nothing,
    also when two transactions race (the second waits for the first to commit or roll back).
    ``conn`` is a psycopg or psycopg2 connection, a SQLAlchemy ``Session``/``Connection`` on
    either, or Django's connection inside ``transaction.atomic()`` (``outbox.connectors``).
    Raises ``InvalidActionRequest`` (naming the field) and writes nothing on bad input; it is
    refused before any SQL runs, so the caller's transaction stays usable.
    ``max_payload_bytes``: the payload's JSON limit (default ``OUTBOX_MAX_PAYLOAD_BYTES``, 64 KiB).
    """
    op = enqueue_operation(schema or default_schema(), request, max_payload_bytes)
    return run_sync_on(conn, op, "enqueue", "enqueue_async")


async def enqueue_async(
    conn: Any,
    request: ActionRequest,
    *,
    schema: str | None = None,
    max_payload_bytes: int | None = None,
) -> Action:
    """The async twin of ``enqueue``: ``conn`` is a psycopg ``AsyncConnection``, an asyncpg
    connection inside a transaction, or a SQLAlchemy ``AsyncSession``/``AsyncConnection``."""
    op = enqueue_operation(schema or default_schema(), request, max_payload_bytes)
    return await run_async_on(conn, op, "enqueue_async", "enqueue")


def enqueue_many(
    conn: Any,
    requests: Sequence[ActionRequest],
    *,
    schema: str | None = None,
    max_payload_bytes: int | None = None,
) -> list[Action]:
    """``enqueue`` of each request in order, in the caller's transaction, as ONE insert.

    A batch job of 10,000 actions then costs one round trip and one NOTIFY instead of one per
    action. Returns one action per request, in request order; ids rise in request order, so the
    actions of one lane run in request order. Idempotency is ``enqueue``'s: an existing key
    returns its action unchanged, a repeated key in the batch returns the first request's
    action, a racing transaction holding a key is waited for. Bad input raises what ``enqueue``
    would raise for the first bad request, with its position in ``index``, and writes nothing
    for the whole batch.
    """
    op = enqueue_many_operation(schema or default_schema(), requests, max_payload_bytes)
    return run_sync_on(conn, op, "enqueue_many", "enqueue_many_async")


async def enqueue_many_async(
    conn: Any,
    requests: Sequence[ActionRequest],
    *,
    schema: str | None = None,
    max_payload_bytes: int | None = None,
) -> list[Action]:
    """The async twin of ``enqueue_many``."""
    op = enqueue_many_operation(schema or default_schema(), requests, max_payload_bytes)
    return await run_async_on(conn, op, "enqueue_many_async", "enqueue_many")


def admit(conn: Any, action_id: int, *, schema: str | None = None) -> Action:
    """A PROPOSED action becomes ADMITTED (due now)."""
    op = admit_operation(schema or default_schema(), action_id)
    return run_sync_on(conn, op, "admit", "admit_async")


async def admit_async(conn: Any, action_id: int, *, schema: str | None = None) -> Action:
    op = admit_operation(schema or default_schema(), action_id)
    return await run_async_on(conn, op, "admit_async", "admit")


def refuse(
    conn: Any, action_id: int, reason: str | None = None, *, schema: str | None = None
) -> Action:
    """A PROPOSED action ends CANCELLED with ``reason`` (``REFUSED`` by default)."""
    op = refuse_operation(schema or default_schema(), action_id, reason)
    return run_sync_on(conn, op, "refuse", "refuse_async")


async def refuse_async(
    conn: Any,
    action_id: int,
    reason: str | None = None,
    *,
    schema: str | None = None,
) -> Action:
    op = refuse_operation(schema or default_schema(), action_id, reason)
    return await run_async_on(conn, op, "refuse_async", "refuse")


def get_action(conn: Any, action_id: int, *, schema: str | None = None) -> Action | None:
    """One action by id, or None when it does not exist (erased, pruned, never was)."""
    return run_sync_on(conn, get_operation(schema or default_schema(), action_id), "get_action")
