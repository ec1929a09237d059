"""A real local HTTP server (``http.server`` in a thread) with faults injected per request.

``FaultyHttpServer(app)`` serves ``app(request) -> Reply`` on 127.0.0.1. ``inject(fault,
method=..., path=...)`` arms one fault for the next request that matches:

- ``"timeout:<s>"``: the app runs (the effect happens), then the reply comes ``s`` seconds late;
- ``"500-after"``: the app runs, then the reply is a 500;
- ``"reset"``: the app runs, then the connection is reset halfway through the reply;
- ``"status:<code>"`` or ``"status:<code>:<retry-after>"``: the app does not run; the reply is
  that status (with ``Retry-After`` when given);
- ``"ratelimited:<seconds>"``: the app does not run; a 403 with ``x-ratelimit-remaining: 0``
  and ``x-ratelimit-reset`` that many seconds from now (GitHub's primary rate limit);
- ``"json:<text>"``: the app does not run; a 200 whose body is that JSON text.

Every request is recorded in ``requests`` (after its fault was chosen).
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body or b"null")


@dataclass
class Reply:
    status: int = 200
    body: Any = None
    headers: dict[str, str] = field(default_factory=dict)

    def encoded(self) -> bytes:
        return b"" if self.body is None else json.dumps(self.body).encode()


@dataclass
class _Fault:
    fault: str
    method: str | None
    path: str | None


class FaultyHttpServer:
    def __init__(self, app: Callable[[Request], Reply]) -> None:
        self.app = app
        self._lock = threading.Lock()
        self._faults: deque[_Fault] = deque()
        self.requests: list[Request] = []
        self._server: ThreadingHTTPServer | None = None

    def inject(
        self, fault: str, *, times: int = 1, method: str | None = None, path: str | None = None
    ) -> None:
        with self._lock:
            self._faults.extend(_Fault(fault, method, path) for _ in range(times))

    def _take(self, request: Request) -> str | None:
        with self._lock:
            self.requests.append(request)
            for armed in self._faults:
                if (armed.method is None or armed.method == request.method) and (
                    armed.path is None or armed.path in request.path
                ):
                    self._faults.remove(armed)
                    return armed.fault
            return None

    @property
    def port(self) -> int:
        assert self._server is not None
        return self._server.server_address[1]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultyHttpServer:
        owner = self

        class Handler(_Handler):
            server_owner = owner

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.block_on_close = False
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_owner: FaultyHttpServer

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass

    def finish(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            super().finish()

    def _handle(self) -> None:
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        request = Request(
            method=self.command,
            path=parts.path,
            query={k: v[-1] for k, v in parse_qs(parts.query).items()},
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
        )
        owner = self.server_owner
        fault = owner._take(request)
        if fault is not None and fault.startswith("status:"):
            _, code, *retry_after = fault.split(":")
            headers = {"retry-after": retry_after[0]} if retry_after else {}
            self._reply(Reply(int(code), {"error": "injected"}, headers))
            return
        if fault is not None and fault.startswith("ratelimited:"):
            reset = int(time.time()) + int(fault.split(":", 1)[1])
            headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(reset)}
            self._reply(Reply(403, {"message": "API rate limit exceeded"}, headers))
            return
        if fault is not None and fault.startswith("json:"):
            self._reply(Reply(200, json.loads(fault.split(":", 1)[1])))
            return
        reply = owner.app(request)
        if fault is None:
            self._reply(reply)
        elif fault.startswith("timeout:"):
            time.sleep(float(fault.split(":", 1)[1]))
            self._reply(reply)
        elif fault == "500-after":
            self._reply(Reply(500, {"error": "written, then failed"}))
        elif fault == "reset":
            data = reply.encoded() or b"{}"
            self.wfile.write(
                f"HTTP/1.1 {reply.status} OK\r\nContent-Type: application/json\r\n"
                f"Content-Length: {len(data) + 100}\r\n\r\n".encode()
                + data[: len(data) // 2]
            )
            self.wfile.flush()
            # SO_LINGER 0: close() sends a RST, not a FIN.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
        else:
            raise AssertionError(f"unknown fault {fault!r}")

    def _reply(self, reply: Reply) -> None:
        data = reply.encoded()
        try:
            self.send_response(reply.status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in reply.headers.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
        except OSError:
            self.close_connection = True  # the client gave up (a timeout fault)

    do_GET = _handle
    do_POST = _handle
