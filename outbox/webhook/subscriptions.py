"""The ``webhook_subscription`` table: who receives which events, with which secrets, and
whether an endpoint that keeps failing was disabled. Every statement is in sql/queries.sql."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from outbox._io import Operation, Statement, psycopg_connection, run_async, run_sync
from outbox.enqueuing import default_schema
from outbox.queries import queries_for
from outbox.webhook.address_guard import AddressRefused, check_endpoint_url
from outbox.webhook.signing import check_secret

#: Event types are names like ``invoice.paid``: letters, digits and ``._-:``; ``*`` matches all.
_EVENT_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-:")


class InvalidSubscription(ValueError):
    """A subscription field the outbox refuses; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True, slots=True)
class Subscription:
    id: int
    endpoint_url: str
    secrets: list[str]
    event_types: list[str]
    enabled: bool
    consecutive_failures: int
    disabled_at: datetime | None
    disabled_reason: str | None
    created_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Subscription:
        return cls(**{name: row[name] for name in cls.__slots__})

    def as_dict(self, *, show_secrets: bool = False) -> dict[str, Any]:
        shown = {name: getattr(self, name) for name in self.__slots__}
        if not show_secrets:
            shown["secrets"] = [f"{s[:10]}…" for s in self.secrets]
        return shown


def check_event_type(event_type: str) -> str:
    if (
        not isinstance(event_type, str)
        or not 1 <= len(event_type) <= 200
        or not (event_type == "*" or set(event_type) <= _EVENT_CHARS)
    ):
        raise InvalidSubscription(
            "event_type",
            f"{event_type!r} must be 1 to 200 of letters, digits and ._-: (or * for every event)",
        )
    return event_type


def check_fields(url: str, secrets: Sequence[str], event_types: Sequence[str]) -> None:
    try:
        check_endpoint_url(url)
    except AddressRefused as refused:
        raise InvalidSubscription("endpoint_url", str(refused)) from None
    if not secrets:
        raise InvalidSubscription("secret", "at least one signing secret is needed")
    for secret in secrets:
        try:
            check_secret(secret)
        except ValueError as error:
            raise InvalidSubscription("secret", str(error)) from None
    if not event_types:
        raise InvalidSubscription("event_type", "at least one event type (or *) is needed")
    for event_type in event_types:
        check_event_type(event_type)


def _one(rows: list[dict[str, Any]]) -> Subscription | None:
    return Subscription.from_row(rows[0]) if rows else None


def add_operation(
    schema: str, url: str, secrets: Sequence[str], event_types: Sequence[str]
) -> Operation[Subscription]:
    check_fields(url, secrets, event_types)
    rows = yield Statement(
        queries_for(schema)["webhook_subscription_insert"],
        {"endpoint_url": url, "secrets": list(secrets), "event_types": list(event_types)},
    )
    return Subscription.from_row(rows[0])


def list_operation(schema: str) -> Operation[list[Subscription]]:
    rows = yield Statement(queries_for(schema)["webhook_subscriptions_all"])
    return [Subscription.from_row(r) for r in rows]


def get_operation(schema: str, subscription_id: int) -> Operation[Subscription | None]:
    rows = yield Statement(
        queries_for(schema)["webhook_subscription_by_id"], {"id": subscription_id}
    )
    return _one(rows)


def disable_operation(
    schema: str, subscription_id: int, reason: str
) -> Operation[Subscription | None]:
    rows = yield Statement(
        queries_for(schema)["webhook_subscription_disable"],
        {"id": subscription_id, "reason": reason},
    )
    return _one(rows)


def enable_operation(schema: str, subscription_id: int) -> Operation[Subscription | None]:
    rows = yield Statement(
        queries_for(schema)["webhook_subscription_enable"], {"id": subscription_id}
    )
    return _one(rows)


def set_secrets_operation(
    schema: str, subscription_id: int, secrets: Sequence[str]
) -> Operation[Subscription | None]:
    for secret in secrets:
        check_secret(secret)
    rows = yield Statement(
        queries_for(schema)["webhook_subscription_set_secrets"],
        {"id": subscription_id, "secrets": list(secrets)},
    )
    return _one(rows)


def remove_operation(schema: str, subscription_id: int) -> Operation[bool]:
    rows = yield Statement(
        queries_for(schema)["webhook_subscription_delete"], {"id": subscription_id}
    )
    return bool(rows)


def matching_operation(schema: str, event_type: str) -> Operation[list[int]]:
    rows = yield Statement(
        queries_for(schema)["webhook_subscriptions_matching"], {"event_type": event_type}
    )
    return [int(r["id"]) for r in rows]


def accepted_operation(schema: str, subscription_id: int) -> Operation[None]:
    yield Statement(queries_for(schema)["webhook_delivery_accepted"], {"id": subscription_id})


def failed_operation(
    schema: str, subscription_id: int, limit: int, reason: str
) -> Operation[dict[str, Any] | None]:
    rows = yield Statement(
        queries_for(schema)["webhook_delivery_failed"],
        {"id": subscription_id, "limit": limit, "reason": reason},
    )
    return rows[0] if rows else None


# -- the application's calls (sync, on its connection) ---------------------------------------------


def add_subscription(
    conn: Any,
    endpoint_url: str,
    secrets: Sequence[str],
    event_types: Sequence[str],
    *,
    schema: str | None = None,
) -> Subscription:
    """Adds a subscription on ``conn`` (commits nothing). Raises ``InvalidSubscription``."""
    op = add_operation(schema or default_schema(), endpoint_url, secrets, event_types)
    return run_sync(psycopg_connection(conn, "add_subscription"), op)


def list_subscriptions(conn: Any, *, schema: str | None = None) -> list[Subscription]:
    return run_sync(
        psycopg_connection(conn, "list_subscriptions"), list_operation(schema or default_schema())
    )


async def get_subscription_async(
    conn: Any, subscription_id: int, schema: str
) -> Subscription | None:
    return await run_async(conn, get_operation(schema, subscription_id))
