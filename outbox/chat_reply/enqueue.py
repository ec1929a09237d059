"""``enqueue_chat_reply``: one chat message (a reply in a thread, or a message in a channel), in
the caller's transaction."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from outbox.action import Action
from outbox.enqueuing import enqueue
from outbox.errors import InvalidActionRequest
from outbox.kinds import CHAT_REPLY
from outbox.request import ActionRequest

_CHANNEL = re.compile(r"[A-Za-z0-9_-]{1,80}")
_TS = re.compile(r"\d{1,12}\.\d{1,9}")


def chat_reply_request(
    channel: str,
    text: str,
    *,
    idempotency_key: str,
    workspace_id: str | int,
    thread_ts: str | None = None,
    max_attempts: int = 8,
    expires_at: datetime | None = None,
) -> ActionRequest:
    if not isinstance(channel, str) or not _CHANNEL.fullmatch(channel):
        raise InvalidActionRequest("channel", "must be a channel id (letters, digits, _ and -)")
    if thread_ts is not None and (not isinstance(thread_ts, str) or not _TS.fullmatch(thread_ts)):
        raise InvalidActionRequest("thread_ts", "must be a message ts such as 1700000000.000100")
    if not isinstance(text, str) or not text.strip():
        raise InvalidActionRequest("text", "must be non-empty text")
    payload: dict[str, Any] = {"channel": channel, "text": text}
    if thread_ts is not None:
        payload["thread_ts"] = thread_ts
    return ActionRequest(
        kind=CHAT_REPLY,
        # One channel's messages are posted one at a time, in the order they were enqueued.
        lane_key=f"chat:{channel}",
        idempotency_key=idempotency_key,
        payload=payload,
        workspace_id=workspace_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )


def enqueue_chat_reply(
    conn: Any,
    channel: str,
    text: str,
    *,
    idempotency_key: str,
    workspace_id: str | int,
    thread_ts: str | None = None,
    max_attempts: int = 8,
    expires_at: datetime | None = None,
    schema: str | None = None,
) -> Action:
    """Enqueues ``text`` to ``channel`` (in the thread of ``thread_ts`` when given) on ``conn``
    (commits nothing). Raises ``InvalidActionRequest`` naming the field."""
    request = chat_reply_request(
        channel,
        text,
        idempotency_key=idempotency_key,
        workspace_id=workspace_id,
        thread_ts=thread_ts,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )
    return enqueue(conn, request, schema=schema)
