"""``WebhookAdapter``: the adapter of the built-in ``WEBHOOK`` kind, and the model of an adapter
that speaks HTTP.

One attempt: read the subscription (removed: CANCELLED; disabled: wait, no attempt spent),
check the endpoint's address (the SSRF guard), build and sign the body, pass the fence, POST
once to the checked address without following redirects, and classify the answer:

==============================================  ==============================================
answer                                          result
==============================================  ==============================================
2xx                                             ``Done("<webhook-id> HTTP <status>")``
410 Gone                                        ``Cancelled(WEBHOOK_GONE)``; the subscription
                                                is disabled
429, or 503 with ``Retry-After``                ``Defer`` that long (capped): a rate limit
other 3xx and 4xx                               ``Failed(HTTP_<code>)``
5xx, timeout, connection refused or reset       ``Retry``: with backoff, before and after the
                                                fence alike
a non-public address, a bad URL                 ``Failed(WEBHOOK_ADDRESS_REFUSED, ...)``
==============================================  ==============================================

Why a resend after the fence is safe: every attempt of one action carries the same
``webhook-id``, and a receiver that follows the Standard Webhooks specification takes a
``webhook-id`` once. So the kind is read-back with the receiver as the read-back: delivery is
at-least-once, and the effect exactly-once at a receiver that dedupes by ``webhook-id``.

Every delivery the endpoint did not accept (a failure, a retry, a refused address) adds one to
the subscription's consecutive failures, an accepted one resets them; at
``disable_after_failures`` the subscription is disabled and its deliveries wait until an operator
enables it (``outbox webhooks enable ID``). Logs name the action, the subscription and the
webhook-id, never the body or the endpoint's reply.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import httpx
import psycopg

from outbox._io import run_async
from outbox.attempt import ActionAttempt
from outbox.connecting import CONNECTION_OPTIONS
from outbox.enqueuing import default_schema
from outbox.results import Abandoned, Cancelled, Defer, Done, Failed, Result, Retry
from outbox.retry_after import capped, parse_retry_after
from outbox.webhook.address_guard import AddressRefused, Target, resolve_target
from outbox.webhook.settings import WebhookSettings
from outbox.webhook.signing import sign_headers, webhook_id
from outbox.webhook.subscriptions import (
    Subscription,
    accepted_operation,
    disable_operation,
    failed_operation,
    get_operation,
)

log = logging.getLogger("outbox.webhook")

USER_AGENT = "outbox-webhooks/1"


def classify(status: int, headers: httpx.Headers, settings: WebhookSettings) -> Result:
    """The result of the endpoint's answer (see the module's table)."""
    if 200 <= status < 300:
        return Done()
    if status == 410:
        return Cancelled("WEBHOOK_GONE")
    reason = f"HTTP_{status}"
    wait = parse_retry_after(headers.get("retry-after"))
    if status == 429:
        return Defer(capped(wait or settings.rate_limit_wait, settings.max_retry_after), reason)
    if status == 503 and wait is not None:
        return Defer(capped(wait, settings.max_retry_after), reason)
    if status >= 500:
        return Retry(reason=reason)
    return Failed(reason)  # 1xx, 3xx (redirects are never followed) and the other 4xx


def body_of(payload: dict[str, Any]) -> str:
    """The JSON a receiver gets: the Standard Webhooks payload shape (type, timestamp, data)."""
    document = {"type": payload["type"], "timestamp": payload["timestamp"], "data": payload["data"]}
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False)


def _payload_ok(payload: Any) -> bool:
    return (
        isinstance(payload, dict)
        and isinstance(payload.get("subscription"), int)
        and isinstance(payload.get("type"), str)
        and isinstance(payload.get("timestamp"), str)
        and isinstance(payload.get("data"), dict)
    )


class WebhookAdapter:
    """Delivers ``WEBHOOK`` actions to their subscriptions' endpoints.

    ``WebhookAdapter(database_url, schema=...)`` and ``outbox.register(WEBHOOK, adapter)``. The
    adapter reads and updates ``webhook_subscription`` on its own short connections (never while
    a request is out), so it needs the outbox's database URL and schema.
    """

    def __init__(
        self,
        database_url: str,
        *,
        schema: str | None = None,
        settings: WebhookSettings | None = None,
    ) -> None:
        self.database_url = database_url
        self.schema = schema or default_schema()
        self.settings = settings or WebhookSettings.from_env()

    def __repr__(self) -> str:
        return f"WebhookAdapter(schema={self.schema!r}, {self.settings})"

    async def _run(self, op: Any) -> Any:
        async with await psycopg.AsyncConnection.connect(
            self.database_url, autocommit=True, **CONNECTION_OPTIONS
        ) as conn:
            return await run_async(conn, op)

    async def execute(self, attempt: ActionAttempt) -> Result:
        payload = attempt.payload
        if not _payload_ok(payload):
            return Failed("WEBHOOK_BAD_PAYLOAD")
        subscription: Subscription | None = await self._run(
            get_operation(self.schema, payload["subscription"])
        )
        if subscription is None:
            return Cancelled("WEBHOOK_SUBSCRIPTION_REMOVED")
        if not subscription.enabled:
            # Waits for an operator; Defer gives the attempt back, so a long outage costs none.
            return Defer(self.settings.disabled_recheck, "WEBHOOK_ENDPOINT_DISABLED")
        try:
            target = await resolve_target(subscription.endpoint_url, self.settings.address_policy)
        except AddressRefused as refused:
            result: Result = (
                Retry(reason=refused.reason)
                if refused.reason == "WEBHOOK_DNS_FAILED"
                else Failed(refused.reason)
            )
            await self._record(attempt, subscription, result)
            return result
        body = body_of(payload)
        msg_id = webhook_id(attempt.idempotency_key)
        # Everything that can fail without the endpoint is done: the fence comes right before
        # the request. No read-back first: the receiver dedupes by webhook-id.
        if not await attempt.fence().begin_write():
            return Abandoned()
        result = await self._post(target, body, msg_id, subscription.secrets)
        await self._record(attempt, subscription, result)
        self._log(attempt, subscription, msg_id, result)
        return result

    async def _post(self, target: Target, body: str, msg_id: str, secrets: list[str]) -> Result:
        headers = {
            **sign_headers(msg_id, body, secrets),
            "content-type": "application/json",
            "user-agent": USER_AGENT,
            "host": target.host_header,
        }
        extensions = {"sni_hostname": target.server_name} if target.server_name else {}
        timeout = self.settings.timeout.total_seconds()
        try:
            # trust_env=False: no proxy from the environment may carry a request past the guard.
            async with httpx.AsyncClient(
                follow_redirects=False, timeout=timeout, trust_env=False
            ) as client:
                response = await client.post(
                    target.url,
                    content=body.encode("utf-8"),
                    headers=headers,
                    extensions=extensions,
                )
        except httpx.TimeoutException:
            return Retry(reason="WEBHOOK_TIMEOUT")
        except httpx.TransportError:
            return Retry(reason="WEBHOOK_CONNECTION_FAILED")
        result = classify(response.status_code, response.headers, self.settings)
        if isinstance(result, Done):
            return Done(f"{msg_id} HTTP {response.status_code}")
        return result

    async def _record(
        self, attempt: ActionAttempt, subscription: Subscription, result: Result
    ) -> None:
        """The subscription's failure count after this delivery. A database error here is logged
        and does not change the result: the delivery's outcome is what the endpoint said."""
        try:
            if isinstance(result, Done):
                if subscription.consecutive_failures:
                    await self._run(accepted_operation(self.schema, subscription.id))
            elif isinstance(result, Cancelled):
                await self._run(
                    disable_operation(self.schema, subscription.id, "ENDPOINT_GONE_410")
                )
                log.warning(
                    "webhook subscription %s disabled: the endpoint answered 410 Gone",
                    subscription.id,
                )
            elif isinstance(result, Retry | Failed):
                limit = self.settings.disable_after_failures
                reason = f"{limit}_CONSECUTIVE_FAILURES"
                row = await self._run(failed_operation(self.schema, subscription.id, limit, reason))
                if row is not None and not row["enabled"] and subscription.enabled:
                    log.warning(
                        "webhook subscription %s disabled after %s consecutive failures",
                        subscription.id,
                        row["consecutive_failures"],
                        extra={"event": "webhook_disabled", "subscription": subscription.id},
                    )
        except (psycopg.Error, OSError) as error:
            log.warning(
                "webhook action %s: could not record the delivery's outcome (%s)",
                attempt.id,
                type(error).__name__,
            )

    @staticmethod
    def _log(
        attempt: ActionAttempt, subscription: Subscription, msg_id: str, result: Result
    ) -> None:
        name = type(result).__name__.lower()
        reason = getattr(result, "reason", None) or ""
        log.log(
            logging.INFO if isinstance(result, Done) else logging.WARNING,
            "webhook action %s attempt %s subscription %s webhook_id=%s: %s %s",
            attempt.id,
            attempt.attempt,
            subscription.id,
            msg_id,
            name,
            reason,
            extra={
                "event": "webhook_attempt",
                "action_id": attempt.id,
                "kind": attempt.kind,
                "subscription": subscription.id,
                "webhook_id": msg_id,
                "result": name,
                "reason": reason,
            },
        )
