"""``enqueue_webhook``: one ``WEBHOOK`` action per enabled subscription to the event, in the
caller's transaction.

Each action's lane is its subscription's (``webhook:<id>``): one endpoint's deliveries run one at
a time, in the order they were enqueued, and a slow or disabled endpoint holds up no other.
The payload keeps the subscription's id, the event type, the event's data and the time it
happened; the endpoint and its secrets are read at every attempt, so a rotated secret or a
disabled endpoint applies to deliveries already waiting.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from outbox._io import Operation
from outbox.action import Action
from outbox.connectors import run_async_on, run_sync_on
from outbox.enqueuing import default_schema, enqueue_many_operation
from outbox.errors import InvalidActionRequest
from outbox.kinds import WEBHOOK
from outbox.request import ActionRequest
from outbox.webhook.subscriptions import InvalidSubscription, check_event_type, matching_operation

#: Attempts of one delivery: with the default backoff (5 s doubling to a 1 h cap) about 3 hours.
DEFAULT_MAX_ATTEMPTS = 12


def lane_of(subscription_id: int) -> str:
    return f"webhook:{subscription_id}"


def webhook_requests(
    subscription_ids: list[int],
    event_type: str,
    data: Mapping[str, Any],
    *,
    idempotency_key: str,
    occurred_at: datetime,
    max_attempts: int,
    expires_at: datetime | None,
) -> list[ActionRequest]:
    return [
        ActionRequest(
            kind=WEBHOOK,
            lane_key=lane_of(sid),
            # One delivery per (event, subscription); its webhook-id derives from this key.
            idempotency_key=f"webhook:{sid}:{idempotency_key}",
            payload={
                "subscription": sid,
                "type": event_type,
                "timestamp": occurred_at.astimezone(UTC).isoformat(),
                "data": dict(data),
            },
            max_attempts=max_attempts,
            expires_at=expires_at,
        )
        for sid in subscription_ids
    ]


def enqueue_webhook_operation(
    schema: str,
    event_type: str,
    data: Mapping[str, Any],
    *,
    idempotency_key: str,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    expires_at: datetime | None = None,
    max_payload_bytes: int | None = None,
) -> Operation[list[Action]]:
    try:
        check_event_type(event_type)
    except InvalidSubscription as error:
        raise InvalidActionRequest("event_type", error.message) from None
    if event_type == "*":
        raise InvalidActionRequest("event_type", "an event has one type, not *")
    if not isinstance(data, Mapping):
        raise InvalidActionRequest("payload", "webhook data must be a JSON object (a dict)")
    if not isinstance(idempotency_key, str) or not idempotency_key:
        raise InvalidActionRequest("idempotency_key", "must be a non-empty string")
    subscription_ids = yield from matching_operation(schema, event_type)
    if not subscription_ids:
        return []
    requests = webhook_requests(
        subscription_ids,
        event_type,
        data,
        idempotency_key=idempotency_key,
        occurred_at=datetime.now(UTC),
        max_attempts=max_attempts,
        expires_at=expires_at,
    )
    actions = yield from enqueue_many_operation(schema, requests, max_payload_bytes)
    return actions


def enqueue_webhook(
    conn: Any,
    event_type: str,
    data: Mapping[str, Any],
    *,
    idempotency_key: str,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    expires_at: datetime | None = None,
    schema: str | None = None,
    max_payload_bytes: int | None = None,
) -> list[Action]:
    """Enqueues ``event_type`` with ``data`` to every enabled subscription to it, on ``conn``
    (commits nothing); returns the actions, one a subscription (none when nobody subscribes).

    ``idempotency_key``: the event's natural key (``invoice:42:paid``); a second call with it
    returns the same actions and each receiver sees one ``webhook-id`` for the event. Raises
    ``InvalidActionRequest`` naming the field (an event type, data the payload cannot hold, or
    more than ``OUTBOX_MAX_PAYLOAD_BYTES``) and enqueues nothing.
    """
    op = enqueue_webhook_operation(
        schema or default_schema(),
        event_type,
        data,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        expires_at=expires_at,
        max_payload_bytes=max_payload_bytes,
    )
    return run_sync_on(conn, op, "enqueue_webhook", "enqueue_webhook_async")


async def enqueue_webhook_async(
    conn: Any,
    event_type: str,
    data: Mapping[str, Any],
    *,
    idempotency_key: str,
    max_attempts: int = DEFAULT_MAX_ATTEMPTS,
    expires_at: datetime | None = None,
    schema: str | None = None,
    max_payload_bytes: int | None = None,
) -> list[Action]:
    """The async twin of ``enqueue_webhook``."""
    op = enqueue_webhook_operation(
        schema or default_schema(),
        event_type,
        data,
        idempotency_key=idempotency_key,
        max_attempts=max_attempts,
        expires_at=expires_at,
        max_payload_bytes=max_payload_bytes,
    )
    return await run_async_on(conn, op, "enqueue_webhook_async", "enqueue_webhook")
