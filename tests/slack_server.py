"""The subset of Slack's Web API the chat reply adapter uses, served by a real local HTTP server
with injected faults: ``chat.postMessage`` (with metadata), ``conversations.history`` (top-level
messages, newest first, ``oldest``) and ``conversations.replies`` (a thread, oldest first), both
paginated by cursor and showing metadata only with ``include_all_metadata``. A request without
the token gets ``{"ok": false, "error": "invalid_auth"}``."""

from __future__ import annotations

import itertools
import threading
import time

from tests.http_sink import FaultyHttpServer, Reply, Request

TOKEN = "xoxb-test-token"


class SlackServer(FaultyHttpServer):
    def __init__(self) -> None:
        super().__init__(self.handle)
        self.messages: dict[str, list[dict]] = {}  # channel -> messages, oldest first
        self._ts = itertools.count(1)
        self._guard = threading.Lock()

    def post(self, channel: str, text: str, thread_ts: str | None = None, metadata=None) -> dict:
        with self._guard:
            # Slack's ts: the post's time in seconds, unique in the channel.
            ts = f"{int(time.time())}.{next(self._ts):06d}"
            message = {"ts": ts, "text": text}
            if thread_ts:
                message["thread_ts"] = thread_ts
            if metadata:
                message["metadata"] = metadata
            self.messages.setdefault(channel, []).append(message)
            return message

    def in_channel(self, channel: str) -> list[dict]:
        with self._guard:
            return list(self.messages.get(channel, []))

    def handle(self, request: Request) -> Reply:
        if request.headers.get("authorization") != f"Bearer {TOKEN}":
            return Reply(200, {"ok": False, "error": "invalid_auth"})
        method = request.path.rsplit("/", 1)[-1]
        if method == "chat.postMessage" and request.method == "POST":
            body = request.json()
            if body["channel"] not in self.messages:
                return Reply(200, {"ok": False, "error": "channel_not_found"})
            message = self.post(
                body["channel"], body["text"], body.get("thread_ts"), body.get("metadata")
            )
            return Reply(200, {"ok": True, "channel": body["channel"], "ts": message["ts"]})
        query = request.query
        channel = query.get("channel", "")
        if channel not in self.messages:
            return Reply(200, {"ok": False, "error": "channel_not_found"})
        found = self.in_channel(channel)
        if method == "conversations.history":
            oldest = float(query.get("oldest", "0"))
            found = [m for m in reversed(found) if "thread_ts" not in m and float(m["ts"]) > oldest]
        elif method == "conversations.replies":
            ts = query["ts"]
            found = [m for m in found if m["ts"] == ts or m.get("thread_ts") == ts]
        else:
            return Reply(200, {"ok": False, "error": "unknown_method"})
        if query.get("include_all_metadata") != "true":
            found = [{k: v for k, v in m.items() if k != "metadata"} for m in found]
        limit = int(query.get("limit", 100))
        start = int(query.get("cursor") or 0)
        page = found[start : start + limit]
        following = str(start + limit) if start + limit < len(found) else ""
        return Reply(
            200,
            {
                "ok": True,
                "messages": page,
                "has_more": bool(following),
                "response_metadata": {"next_cursor": following},
            },
        )
