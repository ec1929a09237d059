"""The demo's HTTP receivers, in-process on loopback: a webhook receiver that verifies every
signature with the Standard Webhooks reference package and takes each ``webhook-id`` once, and
an issue tracker in GitHub's REST shape. Each loses its answer to some requests after it took
them (a 500 after the write), the case that makes a blind resend a duplicate."""

from __future__ import annotations

import itertools
import json
import re
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

#: Every this-many-th write is taken and then answered with a 500.
LOSE_EVERY = 4
TOKEN = "demo-token"
_COMMENTS = re.compile(r"^/repos/([^/]+)/([^/]+)/issues/(\d+)/comments$")


class _Server:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.writes = itertools.count(1)
        self._server: ThreadingHTTPServer | None = None

    def answer(self, method: str, path: str, query: dict, headers: dict, body: bytes):
        raise NotImplementedError

    def start(self) -> str:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _any(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                parts = urlsplit(self.path)
                query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
                headers = {k.lower(): v for k, v in self.headers.items()}
                status, reply, extra = owner.answer(self.command, parts.path, query, headers, body)
                data = json.dumps(reply).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in extra.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            do_GET = _any
            do_POST = _any

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class WebhookReceiver(_Server):
    def __init__(self, secret: str) -> None:
        super().__init__()
        self.verifier = Webhook(secret)
        self.taken: Counter[str] = Counter()  # webhook-id -> deliveries that carried it
        self.bad_signatures = 0

    def answer(self, method, path, query, headers, body):
        try:
            self.verifier.verify(body, headers)
        except WebhookVerificationError:
            with self.lock:
                self.bad_signatures += 1
            return 401, {"error": "bad signature"}, {}
        with self.lock:
            msg_id = headers["webhook-id"]
            first = msg_id not in self.taken
            self.taken[msg_id] += 1
            lose = first and next(self.writes) % LOSE_EVERY == 0
        return (500, {"error": "taken, then lost"}, {}) if lose else (200, {"ok": True}, {})

    def accepted(self) -> int:
        with self.lock:
            return len(self.taken)


class IssueTracker(_Server):
    def __init__(self) -> None:
        super().__init__()
        self.comments: dict[str, list[dict]] = {}
        self._ids = itertools.count(1)

    def answer(self, method, path, query, headers, body):
        if headers.get("authorization") != f"Bearer {TOKEN}":
            return 401, {"message": "Bad credentials"}, {}
        match = _COMMENTS.match(path)
        if match is None:
            return 404, {"message": "Not Found"}, {}
        with self.lock:
            found = self.comments.setdefault(path, [])
            if method == "POST":
                comment = {"id": next(self._ids), "body": json.loads(body)["body"]}
                found.append(comment)
                lose = next(self.writes) % LOSE_EVERY == 0
                return (500, {"message": "lost"}, {}) if lose else (201, comment, {})
            per_page = int(query.get("per_page", 30))
            page = int(query.get("page", 1))
            return 200, found[(page - 1) * per_page : page * per_page], {}

    def markers(self) -> Counter[str]:
        """How many comments carry each marker (the outbox's promise: one each)."""
        with self.lock:
            bodies = [c["body"] for found in self.comments.values() for c in found]
        return Counter(b.rsplit("\n", 1)[-1] for b in bodies)
