"""Probes: the verdict on every process of a role from its health files (``outbox health``),
and a small HTTP server answering ``/livez`` and ``/readyz`` (``--health-port``).

A role is healthy when at least one of its processes runs and every running one is (a worker
pool is as healthy as its least healthy worker process: one stopped process holds its share of
messages). Files of processes that are gone (a crash leaves its file) are skipped.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from outbox.health.state import Verdict, judge

log = logging.getLogger("outbox.health")

ROLES = ("claimer", "worker")


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def role_verdicts(directory: Path, role: str) -> dict[int, Verdict]:
    """Each running process of ``role`` (by pid) with a health file in ``directory``."""
    verdicts: dict[int, Verdict] = {}
    for path in sorted(directory.glob(f"{role}-*.json")):
        try:
            snapshot = json.loads(path.read_text())
        except (OSError, ValueError):
            continue  # removed meanwhile (a clean stop)
        pid = int(snapshot.get("pid", 0))
        if pid and _running(pid):
            verdicts[pid] = judge(snapshot)
    return verdicts


def role_verdict(directory: Path, role: str) -> Verdict:
    """One verdict for the role: none running is neither live nor ready."""
    verdicts = role_verdicts(directory, role)
    if not verdicts:
        missing = f"no running {role} process has a health file in {directory}"
        return Verdict(False, False, (missing,))
    reasons = tuple(f"pid {pid}: {v.line()}" for pid, v in verdicts.items() if not v.ready)
    return Verdict(
        all(v.live for v in verdicts.values()), all(v.ready for v in verdicts.values()), reasons
    )


def present_verdict(directory: Path) -> Verdict:
    """The verdict on every role with a running process here (a container runs one role, so
    one image healthcheck serves a claimer's container and a worker pool's); none: unhealthy."""
    present = [role for role in ROLES if role_verdicts(directory, role)]
    if not present:
        return Verdict(
            False, False, (f"no running outbox process has a health file in {directory}",)
        )
    verdicts = {role: role_verdict(directory, role) for role in present}
    reasons = tuple(f"{role}: {reason}" for role, v in verdicts.items() for reason in v.reasons)
    return Verdict(
        all(v.live for v in verdicts.values()), all(v.ready for v in verdicts.values()), reasons
    )


def _handler(verdict: Callable[[], Verdict]) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path not in ("/livez", "/readyz", "/healthz"):
                self.send_error(404)
                return
            now = verdict()
            good = now.live if self.path == "/livez" else now.ready
            body = json.dumps({"live": now.live, "ready": now.ready, "reasons": now.reasons})
            self.send_response(200 if good else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes come every few seconds; their lines would drown the process's own

    return Handler


def start_health_server(
    verdict: Callable[[], Verdict], port: int, host: str
) -> ThreadingHTTPServer:
    """Serves ``/livez`` (200 while live) and ``/readyz`` (200 while ready; ``/healthz`` is the
    same) on ``host:port`` from a daemon thread; 503 otherwise, with the reasons as JSON. The
    verdict is drawn at each request, so a wedged loop shows though this thread still answers."""
    server = ThreadingHTTPServer((host, port), _handler(verdict))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="outbox-health", daemon=True).start()
    log.info(
        "serving health on %s:%d (/livez, /readyz)",
        host,
        server.server_port,
        extra={"event": "health_server", "port": server.server_port},
    )
    return server
