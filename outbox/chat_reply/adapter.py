"""``ChatReplyAdapter``: the adapter of the built-in ``CHAT_REPLY`` kind (Slack's Web API).

Every message carries ``metadata`` ``{"event_type": "outbox", "event_payload": {"marker":
<digest of the idempotency key>}}``: invisible to readers, and searchable. One attempt:

1. when ``attempt.write_started``: read the thread (``conversations.replies``) or the channel
   since the action was created (``conversations.history``), every page, with their metadata;
   a message with the marker means ``Done(<channel>:<ts>)`` without posting again;
2. pass the fence, then ``chat.postMessage`` once.

==============================================  ==============================================
answer                                          result
==============================================  ==============================================
``{"ok": true, "ts": ...}``                     ``Done("<channel>:<ts>")``
HTTP 429 (``Retry-After``), ``ratelimited``     ``Defer`` that long (capped)
5xx, timeout, connection refused or reset,      ``Retry``; the next attempt reads back first
``internal_error`` and the like
any other ``{"ok": false, "error": e}``         ``Failed(SLACK_<E>)``
``channel_not_found``/``thread_not_found`` to   ``Cancelled``: the message is gone with it
the read-back
the read-back cannot answer (no access, too     ``Uncertain(SLACK_READBACK_...)``
many pages, failing on the last attempt)
==============================================  ==============================================
"""

from __future__ import annotations

import hashlib
import logging
import re
from datetime import timedelta
from typing import Any

import httpx

from outbox.attempt import ActionAttempt
from outbox.chat_reply.settings import ChatReplySettings
from outbox.results import Abandoned, Cancelled, Defer, Done, Failed, Result, Retry, Uncertain
from outbox.retry_after import capped, parse_retry_after

log = logging.getLogger("outbox.chat_reply")

EVENT_TYPE = "outbox"
PAGE_LIMIT = 200
#: Errors the Web API gives when the fault is on its side: try again later.
TRANSIENT = frozenset(
    {"internal_error", "fatal_error", "service_unavailable", "request_timeout", "team_added_to_org"}
)
GONE = frozenset({"channel_not_found", "thread_not_found", "message_not_found"})
#: How far before the action's creation the channel read-back starts (clock skew).
READBACK_SLACK = timedelta(minutes=5)


def marker_of(idempotency_key: str) -> str:
    return hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:32]


def error_code(error: object) -> str:
    """A Slack error name as a stop reason: upper case, letters, digits and _ only."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", str(error or "unknown"))[:60]
    return f"SLACK_{text.upper()}"


class _ReadBack(Exception):
    def __init__(self, result: Result) -> None:
        self.result = result


class ChatReplyAdapter:
    """Posts ``CHAT_REPLY`` actions. ``ChatReplyAdapter(ChatReplySettings.from_env())`` and
    ``outbox.register(CHAT_REPLY, adapter)``; the payload is what ``enqueue_chat_reply``
    records."""

    def __init__(self, settings: ChatReplySettings | None = None) -> None:
        self.settings = settings or ChatReplySettings.from_env()

    def __repr__(self) -> str:
        return f"ChatReplyAdapter({self.settings.api_url})"

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.settings.api_url + "/",
            headers={"authorization": f"Bearer {self.settings.token}", "user-agent": "outbox"},
            timeout=self.settings.timeout.total_seconds(),
            follow_redirects=False,
            trust_env=False,
        )

    def _rate_limited(self, response: httpx.Response, body: Any) -> Defer | None:
        limited = response.status_code == 429 or (
            isinstance(body, dict) and body.get("error") == "ratelimited"
        )
        if not limited:
            return None
        wait = parse_retry_after(response.headers.get("retry-after"))
        return Defer(
            capped(wait or self.settings.rate_limit_wait, self.settings.max_retry_after),
            "SLACK_RATELIMITED",
        )

    async def execute(self, attempt: ActionAttempt) -> Result:
        payload = attempt.payload
        if not (
            isinstance(payload, dict)
            and isinstance(payload.get("channel"), str)
            and isinstance(payload.get("text"), str)
            and isinstance(payload.get("thread_ts", ""), str)
        ):
            return Failed("CHAT_REPLY_BAD_PAYLOAD")
        marker = marker_of(attempt.idempotency_key)
        async with self._client() as client:
            if attempt.write_started:
                try:
                    found = await self._find(client, payload, marker, attempt)
                except _ReadBack as failed:
                    result = failed.result
                    if isinstance(result, Retry) and attempt.attempt >= attempt.max_attempts:
                        return Uncertain(result.reason or "SLACK_READBACK_FAILED")
                    return result
                if found is not None:
                    log.info("chat reply action %s found by read-back: %s", attempt.id, found)
                    return Done(f"{payload['channel']}:{found}")
            if not await attempt.fence().begin_write():
                return Abandoned()
            result = await self._post(client, payload, marker)
        log.log(
            logging.INFO if isinstance(result, Done) else logging.WARNING,
            "chat reply action %s attempt %s: %s %s",
            attempt.id,
            attempt.attempt,
            type(result).__name__.lower(),
            getattr(result, "reason", None) or getattr(result, "ref", ""),
        )
        return result

    async def _call(self, client: httpx.AsyncClient, method: str, params: dict) -> dict:
        """One read method; raises ``_ReadBack`` with the result of anything but ``ok``."""
        try:
            response = await client.get(method, params=params)
        except httpx.TimeoutException:
            raise _ReadBack(Retry(reason="SLACK_READBACK_TIMEOUT")) from None
        except httpx.TransportError:
            raise _ReadBack(Retry(reason="SLACK_READBACK_CONNECTION_FAILED")) from None
        try:
            body = response.json()
        except ValueError:
            body = None
        limited = self._rate_limited(response, body)
        if limited is not None:
            raise _ReadBack(limited)
        if response.status_code >= 500 or not isinstance(body, dict):
            raise _ReadBack(Retry(reason=f"SLACK_READBACK_HTTP_{response.status_code}"))
        if body.get("ok") is True:
            return body
        error = body.get("error")
        if error in GONE:
            raise _ReadBack(Cancelled(error_code(error)))
        if error in TRANSIENT:
            raise _ReadBack(Retry(reason=f"SLACK_READBACK_{error_code(error)[6:]}"))
        raise _ReadBack(Uncertain(f"SLACK_READBACK_{error_code(error)[6:]}"))

    async def _find(
        self, client: httpx.AsyncClient, payload: dict, marker: str, attempt: ActionAttempt
    ) -> str | None:
        """The ts of the message that carries ``marker``, reading every page."""
        params: dict[str, Any] = {
            "channel": payload["channel"],
            "include_all_metadata": "true",
            "limit": PAGE_LIMIT,
        }
        if payload.get("thread_ts"):
            method = "conversations.replies"
            params["ts"] = payload["thread_ts"]
        else:
            method = "conversations.history"
            oldest = attempt.action.created_at - READBACK_SLACK
            params["oldest"] = f"{oldest.timestamp():.6f}"
        for _ in range(self.settings.max_readback_pages):
            body = await self._call(client, method, params)
            for message in body.get("messages") or []:
                metadata = message.get("metadata") if isinstance(message, dict) else None
                if (
                    isinstance(metadata, dict)
                    and metadata.get("event_type") == EVENT_TYPE
                    and (metadata.get("event_payload") or {}).get("marker") == marker
                ):
                    return str(message.get("ts"))
            cursor = (body.get("response_metadata") or {}).get("next_cursor")
            if not cursor:
                return None
            params["cursor"] = cursor
        raise _ReadBack(Uncertain("SLACK_READBACK_TOO_MANY_PAGES"))

    async def _post(self, client: httpx.AsyncClient, payload: dict, marker: str) -> Result:
        message: dict[str, Any] = {
            "channel": payload["channel"],
            "text": payload["text"],
            "metadata": {"event_type": EVENT_TYPE, "event_payload": {"marker": marker}},
        }
        if payload.get("thread_ts"):
            message["thread_ts"] = payload["thread_ts"]
        try:
            response = await client.post("chat.postMessage", json=message)
        except httpx.TimeoutException:
            return Retry(reason="SLACK_TIMEOUT")
        except httpx.TransportError:
            return Retry(reason="SLACK_CONNECTION_FAILED")
        try:
            body = response.json()
        except ValueError:
            body = None
        limited = self._rate_limited(response, body)
        if limited is not None:
            return limited
        if response.status_code >= 500 or not isinstance(body, dict):
            return Retry(reason=f"SLACK_HTTP_{response.status_code}")
        if body.get("ok") is True and body.get("ts"):
            return Done(f"{body.get('channel') or payload['channel']}:{body['ts']}")
        error = body.get("error")
        if error in TRANSIENT:
            return Retry(reason=error_code(error))
        return Failed(error_code(error))
