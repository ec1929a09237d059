"""Webhooks: the built-in ``WEBHOOK`` kind, signed per the Standard Webhooks specification.

``add_subscription`` (or ``outbox webhooks add``) records an endpoint; ``enqueue_webhook``
records one delivery per enabled subscription to an event in the caller's transaction;
``WebhookAdapter`` (with ``outbox/retry_after.py`` the model of an adapter that speaks HTTP)
delivers each, at least once, with one ``webhook-id`` a delivery so the receiver takes it once.
"""

from outbox.kinds import WEBHOOK
from outbox.webhook.adapter import WebhookAdapter
from outbox.webhook.address_guard import AddressPolicy, AddressRefused, is_public
from outbox.webhook.enqueue import enqueue_webhook, enqueue_webhook_async
from outbox.webhook.settings import WebhookSettings
from outbox.webhook.signing import new_secret, sign_headers, webhook_id
from outbox.webhook.subscriptions import (
    InvalidSubscription,
    Subscription,
    add_subscription,
    list_subscriptions,
)

__all__ = [
    "WEBHOOK",
    "AddressPolicy",
    "AddressRefused",
    "InvalidSubscription",
    "Subscription",
    "WebhookAdapter",
    "WebhookSettings",
    "add_subscription",
    "enqueue_webhook",
    "enqueue_webhook_async",
    "is_public",
    "list_subscriptions",
    "new_secret",
    "sign_headers",
    "webhook_id",
]
