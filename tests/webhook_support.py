"""Helpers of the webhook tests: an outbox with a WebhookAdapter on a real schema, and one
receiver subscribed to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg

from outbox import Action, Outbox, get_action
from outbox.webhook import (
    WEBHOOK,
    AddressPolicy,
    Subscription,
    WebhookAdapter,
    WebhookSettings,
    add_subscription,
    enqueue_webhook,
    new_secret,
)
from tests.webhook_receiver import WebhookReceiver

#: Tests deliver to 127.0.0.1, which the guard refuses unless allowed.
LOOPBACK = AddressPolicy.parse("127.0.0.0/8,::1/128")


def loopback_settings(**overrides: Any) -> WebhookSettings:
    values: dict[str, Any] = {"address_policy": LOOPBACK, "timeout": timedelta(seconds=1)}
    values.update(overrides)
    return WebhookSettings(**values)


@dataclass
class Hooks:
    outbox: Outbox
    adapter: WebhookAdapter
    database_url: str
    schema: str
    secret: str = field(default_factory=new_secret)

    def subscribe(self, url: str, events: tuple[str, ...] = ("*",), secrets=None) -> Subscription:
        with psycopg.connect(self.database_url) as conn:
            found = add_subscription(
                conn, url, secrets or [self.secret], list(events), schema=self.schema
            )
            conn.commit()
        return found

    def send(self, event_type: str = "invoice.paid", key: str = "invoice:1", **kw) -> list[int]:
        with psycopg.connect(self.database_url) as conn:
            actions = enqueue_webhook(
                conn, event_type, {"invoice": 1}, idempotency_key=key, schema=self.schema, **kw
            )
            conn.commit()
        return [a.id for a in actions]

    def action(self, action_id: int) -> Action:
        with psycopg.connect(self.database_url) as conn:
            return get_action(conn, action_id, schema=self.schema)

    def subscription(self, subscription_id: int) -> dict[str, Any]:
        with psycopg.connect(self.database_url) as conn:
            cur = conn.execute(
                f'SELECT * FROM "{self.schema}".webhook_subscription WHERE id = %s',
                (subscription_id,),
            )
            names = [c.name for c in cur.description or []]
            row = cur.fetchone()
        return dict(zip(names, row, strict=True)) if row else {}


def make_hooks(make_outbox, database_url: str, schema: str, **settings: Any) -> Hooks:
    outbox = make_outbox()
    adapter = WebhookAdapter(database_url, schema=schema, settings=loopback_settings(**settings))
    outbox.register(WEBHOOK, adapter)
    outbox.migrate()
    return Hooks(outbox, adapter, database_url, schema)


def receiver_for(hooks: Hooks, *secrets: str) -> WebhookReceiver:
    return WebhookReceiver(secrets or [hooks.secret]).start()
