"""``enqueue_email``: record one email in the caller's transaction, as an action of kind ``EMAIL``.

The notice prepares the message once here, so a recipient who cannot receive it is refused at
once (``RecipientCannotReceive``, nothing enqueued) and a broken notice fails in the caller's
request, not in a worker. Only ``{"notice": name, "event": event}`` is stored: the message is
rendered again before every attempt from current data, never kept in the database.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from psycopg import AsyncConnection

from outbox.action import Action
from outbox.email.message import check_buildable
from outbox.email.notice import (
    CannotReceive,
    EmailNotice,
    PreparedEmail,
    RecipientCannotReceive,
    checked_name,
    outcome,
)
from outbox.enqueuing import enqueue, enqueue_async
from outbox.errors import InvalidActionRequest
from outbox.kinds import EMAIL
from outbox.request import ActionRequest


def default_idempotency_key(notice: EmailNotice, event: Mapping[str, Any]) -> str:
    """``email:<notice>:<hash of the event>``: the same notice about the same event is one email,
    however often the caller's code path runs."""
    canonical = json.dumps(event, sort_keys=True, separators=(",", ":"), allow_nan=False)
    digest = hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:32]
    return f"email:{checked_name(notice)}:{digest}"


def email_request(
    notice: EmailNotice,
    event: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    lane_key: str | None = None,
    subject_account_id: str | int | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
) -> ActionRequest:
    """The ``ActionRequest`` of one email (without preparing it)."""
    if not isinstance(event, Mapping):
        raise InvalidActionRequest("payload", "an email event must be a JSON object (a dict)")
    name = checked_name(notice)
    try:
        key = (
            idempotency_key
            or notice.idempotency_key(event)
            or default_idempotency_key(notice, event)
        )
    except (TypeError, ValueError, RecursionError) as error:  # hashing the event as JSON
        raise InvalidActionRequest("payload", f"the email event is not JSON: {error}") from None
    if expires_at is None and notice.expires_after is not None:
        expires_at = datetime.now(UTC) + notice.expires_after
    return ActionRequest(
        kind=EMAIL,
        # Emails are independent: each its own lane unless the caller wants an order.
        lane_key=lane_key or f"email:{key}",
        idempotency_key=key,
        payload={"notice": name, "event": dict(event)},
        subject_account_id=subject_account_id,
        max_attempts=max_attempts or notice.max_attempts,
        expires_at=expires_at,
    )


def _refuse_unless_sendable(
    notice: EmailNotice, prepared: object, request: ActionRequest
) -> PreparedEmail:
    """The prepared email, if its recipient can receive it and a message can be built from it
    (else ``InvalidEmail``, a ``ValueError``: an attempt would end FAILED ``MESSAGE_INVALID``)."""
    checked = outcome(prepared)
    if isinstance(checked, CannotReceive):
        raise RecipientCannotReceive(notice.name, checked.reason)
    check_buildable(checked, request.idempotency_key)
    return checked


def enqueue_email(
    conn: Any,
    notice: EmailNotice,
    event: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    lane_key: str | None = None,
    subject_account_id: str | int | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
    schema: str | None = None,
) -> Action:
    """Prepares ``notice`` for ``event`` and enqueues it on ``conn`` (commits nothing).

    Raises ``RecipientCannotReceive`` (with the notice's reason) and enqueues nothing when the
    recipient cannot receive it; ``ValueError`` (``InvalidEmail``) when the notice renders an
    email no message can be built from; ``InvalidActionRequest`` (a ``ValueError`` too) naming
    the field when the request is bad (say an event the payload cannot hold).
    ``subject_account_id``: the recipient's account, so that erasing it deletes a pending email.
    A second call with the same idempotency key returns the first action.
    """
    request = email_request(
        notice,
        event,
        idempotency_key=idempotency_key,
        lane_key=lane_key,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )
    try:
        _refuse_unless_sendable(notice, notice.prepare(request.payload["event"]), request)
    except RecipientCannotReceive as refused:
        raise RecipientCannotReceive(notice.name, refused.reason) from None
    return enqueue(conn, request, schema=schema)


async def enqueue_email_async(
    conn: AsyncConnection[Any],
    notice: EmailNotice,
    event: Mapping[str, Any],
    *,
    idempotency_key: str | None = None,
    lane_key: str | None = None,
    subject_account_id: str | int | None = None,
    max_attempts: int | None = None,
    expires_at: datetime | None = None,
    schema: str | None = None,
) -> Action:
    """The async twin of ``enqueue_email`` (uses the notice's ``prepare_async``)."""
    request = email_request(
        notice,
        event,
        idempotency_key=idempotency_key,
        lane_key=lane_key,
        subject_account_id=subject_account_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )
    try:
        prepared = await notice.prepare_async(request.payload["event"])
        _refuse_unless_sendable(notice, prepared, request)
    except RecipientCannotReceive as refused:
        raise RecipientCannotReceive(notice.name, refused.reason) from None
    return await enqueue_async(conn, request, schema=schema)
