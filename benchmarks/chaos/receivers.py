"""The soak's HTTP providers, in a process of their own so that they outlive every kill:
``python -m benchmarks.chaos.receivers DATABASE_URL WORLD_SCHEMA PORT``.

One threaded HTTP server on loopback serves three providers, each committing its writes to the
soak's PostgreSQL (``<world>``) before it answers, and reading back from there:

- ``POST /hooks/<slot>``: a webhook receiver. It verifies every request with the Standard
  Webhooks reference package against the slot's secret (``<world>.webhook_endpoint``); a bad
  signature is counted (``webhook_bad_signature``) and refused with 401. Every verified delivery
  is recorded (``webhook_delivery``): the effect is one per ``webhook-id``, a resend of the same
  id is counted and changes nothing.
- ``/github/repos/{owner}/{repo}/issues/{n}/comments``: GitHub's REST shape (create; list with
  ``per_page``/``page`` and ``Link: rel="next"``), into ``issue_comment``.
- ``/slack/api/chat.postMessage``, ``conversations.history``, ``conversations.replies``:
  Slack's Web API shape, metadata included with ``include_all_metadata``, into
  ``chat_message``.

Faults: the soak chooses one per action and writes it into what the provider receives (the
webhook's ``data.fault``, ``[fault:X]`` in a comment's body or a message's text). Each action
meets its fault on its first write request only (counted here: the process is never killed):

- ``e``: the write is committed, then the answer is a 500;
- ``x``: the write is committed, then the connection is reset halfway through the answer;
- ``t``: the write is committed, then the answer comes ``SLOW_REPLY`` s late, past the client's
  timeout;
- ``r``: nothing is written; 429 with ``Retry-After: 1``.

Each fault met is recorded in ``http_fault_met`` (best effort). While the database is down (a
restart), writes and reads answer 503 and nothing is written; a connection the restart broke is
replaced before it is used again.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import socket
import struct
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

import psycopg
from psycopg_pool import ConnectionPool
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

#: What the process prints once it listens.
READY = "chaos receivers ready"
#: The token the issue tracker and the chat API take.
TOKEN = "chaos-token"
#: Seconds a ``t`` fault holds the answer back: past the soak's 1 s client timeouts.
SLOW_REPLY = 1.5
#: How long a request waits for a database connection before it answers 503.
DB_WAIT = 2.0

_ISSUE = re.compile(r"^/github/repos/([^/]+)/([^/]+)/issues/(\d+)/comments$")
_MARKER = re.compile(r"<!-- outbox:([0-9a-f]+) -->")
_FAULT = re.compile(r"\[fault:([a-z])\]")

Reply = tuple[int, Any, dict[str, str]]


class DatabaseDown(Exception):
    """The write or read could not reach the database: nothing was written."""


class Providers:
    def __init__(self, pool: ConnectionPool, world: str) -> None:
        self.pool = pool
        self.w = f'"{world}"'
        self.lock = threading.Lock()
        #: The effects whose first write request was seen (each meets its fault once).
        self.seen: set[str] = set()
        self.ts = itertools.count(1)
        #: This server's own URL (the issue tracker's next-page links point to it).
        self.base = ""
        with pool.connection() as conn:
            rows = conn.execute(f"SELECT slot, secret FROM {self.w}.webhook_endpoint").fetchall()
        self.verifiers = {slot: Webhook(secret) for slot, secret in rows}

    def sql(self, query: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        try:
            with self.pool.connection(timeout=DB_WAIT) as conn:
                cur = conn.execute(query.format(w=self.w), params)
                return cur.fetchall() if cur.description else []
        except (psycopg.Error, OSError) as error:
            raise DatabaseDown from error

    def first_fault(self, kind: str, key: str, fault: str) -> str:
        """``fault`` the first time the effect ``key`` is written, else nothing."""
        with self.lock:
            if key in self.seen:
                return ""
            self.seen.add(key)
        if fault:
            with contextlib.suppress(DatabaseDown):
                self.sql(
                    "INSERT INTO {w}.http_fault_met (kind, fault, key) VALUES (%s, %s, %s)",
                    (kind, fault, key),
                )
        return fault

    # -- the webhook receiver ------------------------------------------------------------------

    def webhook(self, slot: str, headers: dict[str, str], body: bytes) -> tuple[Reply, str]:
        verifier = self.verifiers.get(slot)
        try:
            if verifier is None:
                raise WebhookVerificationError("no such endpoint")
            event = verifier.verify(body, headers)
        except WebhookVerificationError:
            self.sql(
                "INSERT INTO {w}.webhook_bad_signature (slot, webhook_id) VALUES (%s, %s)",
                (slot, headers.get("webhook-id", "")),
            )
            return (401, {"error": "bad signature"}, {}), ""
        msg_id = headers["webhook-id"]
        data = event.get("data") or {}
        # Before the write: a rate limit takes nothing.
        if msg_id not in self.seen and data.get("fault") == "r":
            return (429, {"error": "slow down"}, {"retry-after": "1"}), self.first_fault(
                "WEBHOOK", msg_id, "r"
            )
        self.sql(
            "INSERT INTO {w}.webhook_delivery (webhook_id, event, slot) VALUES (%s, %s, %s)",
            (msg_id, f"{data.get('key')}@{slot}", slot),
        )
        return (200, {"ok": True}, {}), self.first_fault("WEBHOOK", msg_id, data.get("fault", ""))

    # -- the issue tracker ---------------------------------------------------------------------

    def issue(self, method: str, match: re.Match[str], query: dict[str, str], body: bytes):
        owner, repo, issue = match[1], match[2], int(match[3])
        if method == "POST":
            text = str(json.loads(body)["body"])
            found = _MARKER.search(text)
            marker = found.group(1) if found else ""
            fault = (_FAULT.search(text) or [None, ""])[1]
            if marker not in self.seen and fault == "r":
                return (429, {"message": "slow down"}, {"retry-after": "1"}), self.first_fault(
                    "ISSUE_COMMENT", marker, "r"
                )
            rows = self.sql(
                "INSERT INTO {w}.issue_comment (owner, repo, issue, body, marker)"
                " VALUES (%s, %s, %s, %s, %s) RETURNING id",
                (owner, repo, issue, text, marker),
            )
            reply = (201, {"id": rows[0][0], "body": text}, {})
            return reply, self.first_fault("ISSUE_COMMENT", marker, fault)
        per_page = min(int(query.get("per_page", 30)), 100)
        page = int(query.get("page", 1))
        rows = self.sql(
            "SELECT id, body FROM {w}.issue_comment WHERE owner = %s AND repo = %s AND issue = %s"
            " ORDER BY id LIMIT %s OFFSET %s",
            (owner, repo, issue, per_page + 1, (page - 1) * per_page),
        )
        headers = {}
        if len(rows) > per_page:
            path = match.group(0)
            headers["link"] = f'<{self.base}{path}?per_page={per_page}&page={page + 1}>; rel="next"'
        return (200, [{"id": i, "body": b} for i, b in rows[:per_page]], headers), ""

    # -- the chat API --------------------------------------------------------------------------

    def chat(self, method: str, name: str, query: dict[str, str], body: bytes):
        if name == "chat.postMessage" and method == "POST":
            message = json.loads(body)
            marker = str(((message.get("metadata") or {}).get("event_payload") or {}).get("marker"))
            fault = (_FAULT.search(str(message.get("text"))) or [None, ""])[1]
            if marker not in self.seen and fault == "r":
                return (429, {"ok": False, "error": "ratelimited"}, {"retry-after": "1"}), (
                    self.first_fault("CHAT_REPLY", marker, "r")
                )
            now = time.time()
            ts = f"{int(now)}.{next(self.ts):06d}"
            self.sql(
                "INSERT INTO {w}.chat_message (channel, ts, ts_num, thread_ts, text, marker,"
                " metadata) VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (
                    message["channel"],
                    ts,
                    now,
                    message.get("thread_ts"),
                    message["text"],
                    marker,
                    json.dumps(message.get("metadata")),
                ),
            )
            reply = (200, {"ok": True, "channel": message["channel"], "ts": ts}, {})
            return reply, self.first_fault("CHAT_REPLY", marker, fault)
        channel = query.get("channel", "")
        if name == "conversations.history":
            where = "thread_ts IS NULL AND ts_num > %s ORDER BY id DESC"
            arg: Any = float(query.get("oldest", "0"))
        elif name == "conversations.replies":
            where = "(ts = %s OR thread_ts = %s) ORDER BY id"
            arg = query.get("ts", "")
        else:
            return (200, {"ok": False, "error": "unknown_method"}, {}), ""
        limit = int(query.get("limit", 100))
        start = int(query.get("cursor") or 0)
        args = (channel, arg, arg) if name == "conversations.replies" else (channel, arg)
        rows = self.sql(
            "SELECT ts, thread_ts, text, metadata FROM {w}.chat_message WHERE channel = %s AND "
            f"{where} LIMIT %s OFFSET %s",
            (*args, limit + 1, start),
        )
        messages = []
        for ts, thread_ts, text, metadata in rows[:limit]:
            shown: dict[str, Any] = {"ts": ts, "text": text}
            if thread_ts:
                shown["thread_ts"] = thread_ts
            if metadata and query.get("include_all_metadata") == "true":
                shown["metadata"] = json.loads(metadata)
            messages.append(shown)
        following = str(start + limit) if len(rows) > limit else ""
        reply = {
            "ok": True,
            "messages": messages,
            "has_more": bool(following),
            "response_metadata": {"next_cursor": following},
        }
        return (200, reply, {}), ""

    def answer(
        self, method: str, path: str, query: dict[str, str], headers: dict[str, str], body: bytes
    ) -> tuple[Reply, str]:
        """The reply, and the fault to apply to it after the write (``e``, ``x``, ``t``)."""
        try:
            if path.startswith("/hooks/") and method == "POST":
                return self.webhook(path.removeprefix("/hooks/"), headers, body)
            if path.startswith(("/github/", "/slack/")):
                if headers.get("authorization") != f"Bearer {TOKEN}":
                    return (401, {"ok": False, "error": "invalid_auth"}, {}), ""
                match = _ISSUE.match(path)
                if match is not None:
                    return self.issue(method, match, query, body)
                if path.startswith("/slack/api/"):
                    return self.chat(method, path.removeprefix("/slack/api/"), query, body)
            return (404, {"message": "Not Found"}, {}), ""
        except DatabaseDown:
            return (503, {"ok": False, "error": "service_unavailable"}, {}), ""


def handler_for(providers: Providers) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def finish(self) -> None:
            with contextlib.suppress(OSError, ValueError):
                super().finish()

        def _any(self) -> None:
            length = int(self.headers.get("content-length") or 0)
            body = self.rfile.read(length) if length else b""
            if len(body) < length:
                # The client died mid-request (a SIGKILLed worker): no request arrived, so
                # nothing is taken and no signature is judged.
                self.close_connection = True
                return
            parts = urlsplit(self.path)
            query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
            headers = {k.lower(): v for k, v in self.headers.items()}
            (status, reply, extra), fault = providers.answer(
                self.command, parts.path, query, headers, body
            )
            if fault == "e":
                status, reply, extra = 500, {"error": "written, then failed"}, {}
            elif fault == "t":
                time.sleep(SLOW_REPLY)
            data = json.dumps(reply).encode()
            if fault == "x":
                self._reset(status, data)
                return
            try:
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)
                self.wfile.flush()
            except OSError:
                self.close_connection = True  # the client gave up (a slow answer)

        def _reset(self, status: int, data: bytes) -> None:
            """Half the answer, then a TCP reset (SO_LINGER 0: close() sends RST, not FIN)."""
            with contextlib.suppress(OSError):
                self.wfile.write(
                    f"HTTP/1.1 {status} OK\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data) + 100}\r\n\r\n".encode()
                    + data[: len(data) // 2]
                )
                self.wfile.flush()
                self.connection.setsockopt(
                    socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                )
                self.connection.close()
            self.close_connection = True

        do_GET = _any
        do_POST = _any

    return Handler


class QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that gave up (its timeout, a reset fault, a killed worker) closes its end:
        # expected here, not worth a traceback.
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


def serve(database_url: str, world: str, port: int, ready: Callable[[str], None]) -> None:
    pool = ConnectionPool(
        database_url,
        min_size=2,
        max_size=8,
        kwargs={"autocommit": True},
        # A connection a database restart broke is replaced before it is used.
        check=ConnectionPool.check_connection,
        open=False,
    )
    pool.open(wait=True)
    providers = Providers(pool, world)
    providers.base = f"http://127.0.0.1:{port}"
    server = QuietServer(("127.0.0.1", port), handler_for(providers))
    ready(f"{READY} on port {port}")
    server.serve_forever()


def main(argv: list[str]) -> None:
    database_url, world, port = argv
    serve(database_url, world, int(port), lambda line: print(line, flush=True))


if __name__ == "__main__":
    main(sys.argv[1:])
