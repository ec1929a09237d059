"""``outbox dashboard``: a small server-rendered page of what the outbox is doing.

It shows counts by kind and state, each kind's backlog and its oldest age, blocked lanes, the
latest UNCERTAIN and FAILED actions, and one action's details; the broker's queues are served by
dramatiq-dashboard under ``/queues`` when the broker is Redis and that package is installed.
Read-only: it never changes an action.
"""

from __future__ import annotations

import html
import logging
import re
from collections.abc import Callable, Iterable
from datetime import datetime
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from psycopg_pool import ConnectionPool

from outbox._io import run_sync
from outbox.status import StatusReport, inspect_operation, json_default, status_operation

log = logging.getLogger("outbox.dashboard")

StartResponse = Callable[..., Any]
_ACTION_PATH = re.compile(r"^/actions/(\d+)/?$")
#: The page reloads itself this often (seconds), so a person watching sees the backlog move.
REFRESH_SECONDS = 5

_STYLE = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#1d232a;background:#fafafa}
h1{font-size:1.5rem;margin:0 0 .25rem}h2{font-size:1.1rem;margin-top:2rem}
table{border-collapse:collapse;background:#fff;min-width:40rem}
th,td{border:1px solid #d0d7de;padding:.35rem .6rem;text-align:left}
td{font-variant-numeric:tabular-nums}
th{background:#f0f3f6}.num{text-align:right}.muted{color:#6e7781}
.UNCERTAIN{color:#9a6700;font-weight:600}.FAILED{color:#cf222e;font-weight:600}
.DONE{color:#1a7f37}nav a{margin-right:1rem}
"""


def _e(value: Any) -> str:
    """One value as escaped HTML text: times to the second, None as a muted dash."""
    if value is None:
        return '<span class="muted">-</span>'
    if isinstance(value, datetime):
        return html.escape(value.strftime("%Y-%m-%d %H:%M:%S %Z"))
    return html.escape(str(json_default(value) if not isinstance(value, str | int) else value))


def _state_class(value: Any) -> str:
    """A CSS class for a state name (colours UNCERTAIN, FAILED, DONE), else none."""
    return str(value) if value in STATES else ""


def _page(title: str, body: str, refresh: bool = True) -> bytes:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_SECONDS}">' if refresh else ""
    return (
        "<!doctype html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title>{meta}<style>{_STYLE}</style></head><body>"
        "<nav><a href='/'>Overview</a><a href='/queues/'>Broker queues</a></nav>"
        f"{body}</body></html>"
    ).encode()


def _table(headers: Iterable[str], rows: Iterable[Iterable[str]], empty: str) -> str:
    rows = list(rows)
    if not rows:
        return f'<p class="muted">{html.escape(empty)}</p>'
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(cells) + "</tr>" for cells in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STATES = ("PROPOSED", "ADMITTED", "EXECUTING", "DONE", "UNCERTAIN", "FAILED", "CANCELLED")


def render_overview(report: StatusReport, schema: str) -> bytes:
    kinds = sorted(set(report.counts) | set(report.backlog))
    counts = _table(
        ["kind", *STATES],
        (
            [f"<td>{_e(kind)}</td>"]
            + [f'<td class="num {s}">{report.counts.get(kind, {}).get(s, 0)}</td>' for s in STATES]
            for kind in kinds
        ),
        "No kinds declared yet: run `outbox migrate`.",
    )
    backlog = _table(
        ["kind", "queue", "due now", "oldest due (s)", "in flight", "blocked lanes"],
        (
            [
                f"<td>{_e(kind)}</td>",
                f"<td>{_e(b.get('queue'))}</td>",
                f'<td class="num">{b.get("due", 0)}</td>',
                f'<td class="num">{b.get("oldest_due_age", 0.0):.1f}</td>',
                f'<td class="num">{b.get("in_flight", 0)}</td>',
                f'<td class="num">{b.get("blocked_lanes", 0)}</td>',
            ]
            for kind, b in sorted(report.backlog.items())
        ),
        "Nothing waiting.",
    )

    def ended(items: list[dict[str, Any]], state: str) -> str:
        return _table(
            ["action", "kind", "reason", "attempt", "ended"],
            (
                [
                    f'<td><a href="/actions/{int(i["id"])}">#{int(i["id"])}</a></td>',
                    f"<td>{_e(i['kind'])}</td>",
                    f'<td class="{state}">{_e(i["stop_reason"])}</td>',
                    f'<td class="num">{_e(i["attempt"])}/{_e(i["max_attempts"])}</td>',
                    f"<td>{_e(i['ended_at'])}</td>",
                ]
                for i in items
            ),
            f"No {state} actions.",
        )

    body = (
        f"<h1>outbox</h1><p class='muted'>schema {_e(schema)} · refreshes every "
        f"{REFRESH_SECONDS}s</p>"
        f"<h2>Actions by kind and state</h2>{counts}"
        f"<h2>Backlog</h2>{backlog}"
        f"<h2>Latest UNCERTAIN</h2><p class='muted'>May have happened: check the provider "
        f"before sending again.</p>{ended(report.latest_uncertain, 'UNCERTAIN')}"
        f"<h2>Latest FAILED</h2>{ended(report.latest_failed, 'FAILED')}"
        "<form action='/actions/' method='get'><h2>Find an action</h2>"
        "<input name='id' placeholder='action id' inputmode='numeric'> "
        "<button>Show</button></form>"
    )
    return _page("outbox", body)


def render_action(found: dict[str, Any] | None, action_id: int) -> bytes:
    if found is None:
        body = (
            f"<h1>Action #{action_id}</h1><p>No such action: it never existed, was erased, "
            "or ended longer ago than the retention.</p>"
        )
        return _page(f"action {action_id}", body, refresh=False)
    action = found["action"]
    fields = _table(
        ["field", "value"],
        (
            [f"<th>{html.escape(name)}</th>", f'<td class="{_state_class(value)}">{_e(value)}</td>']
            for name, value in action.items()
        ),
        "",
    )
    lane = found["lane"]
    history = _table(
        ["at", "event", "detail"],
        (
            [f"<td>{_e(e['at'])}</td>", f"<td>{_e(e['event'])}</td>", f"<td>{_e(e['detail'])}</td>"]
            for e in found["history"]
        ),
        "",
    )
    body = (
        f"<h1>Action #{int(action['id'])} · {_e(action['kind'])} · "
        f"<span class='{_state_class(action['state'])}'>{_e(action['state'])}</span></h1>"
        f"<p>Attempts: {_e(found['attempts'])}. Lane {_e(lane['lane_key'])}: head "
        f"{_e(lane['head_id'])}, executing {_e(lane['executing_id'])}, "
        f"{_e(lane['waiting_before'])} waiting before this one.</p>"
        f"<h2>History</h2>{history}<h2>Fields</h2>{fields}"
    )
    return _page(f"action {action['id']}", body)


class DashboardApp:
    """The WSGI application. ``broker``: a Dramatiq RedisBroker to mount dramatiq-dashboard for."""

    def __init__(self, pool: ConnectionPool, schema: str, broker: Any = None) -> None:
        self.pool = pool
        self.schema = schema
        self.queues = _queues_app(broker)

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "/") or "/"
        try:
            if path.startswith("/queues"):
                if self.queues is None:
                    return self._respond(
                        start_response,
                        "404 Not Found",
                        _page(
                            "queues",
                            "<h1>Broker queues</h1><p>Not available: the broker is not Redis, "
                            "or dramatiq-dashboard is not installed.</p>",
                            refresh=False,
                        ),
                    )
                return self.queues(environ, start_response)
            if path == "/healthz":
                with self.pool.connection() as conn:
                    conn.execute("SELECT 1")
                return self._respond(start_response, "200 OK", b"ok", "text/plain")
            if path in ("/actions", "/actions/"):
                query = environ.get("QUERY_STRING", "")
                match = re.search(r"(?:^|&)id=#?(\d+)", query)
                target = f"/actions/{match[1]}" if match else "/"
                start_response("303 See Other", [("Location", target)])
                return [b""]
            match = _ACTION_PATH.match(path)
            if match:
                action_id = int(match[1])
                with self.pool.connection() as conn:
                    found = run_sync(conn, inspect_operation(self.schema, action_id))
                status = "200 OK" if found else "404 Not Found"
                return self._respond(start_response, status, render_action(found, action_id))
            if path == "/":
                with self.pool.connection() as conn:
                    report = run_sync(conn, status_operation(self.schema))
                return self._respond(start_response, "200 OK", render_overview(report, self.schema))
            return self._respond(
                start_response, "404 Not Found", _page("not found", "<h1>Not found</h1>", False)
            )
        except Exception:
            log.exception("dashboard request %s failed", path)
            return self._respond(
                start_response,
                "500 Internal Server Error",
                _page("error", "<h1>The database could not be read</h1>", refresh=True),
            )

    @staticmethod
    def _respond(
        start_response: StartResponse, status: str, body: bytes, content_type: str = "text/html"
    ) -> list[bytes]:
        start_response(
            status,
            [
                ("Content-Type", f"{content_type}; charset=utf-8"),
                ("Content-Length", str(len(body))),
            ],
        )
        return [body]


def _queues_app(broker: Any) -> Callable[..., Iterable[bytes]] | None:
    """dramatiq-dashboard's WSGI app under /queues, for a Redis broker only."""
    if broker is None:
        return None
    try:
        from dramatiq.brokers.redis import RedisBroker
        from dramatiq_dashboard import DashboardApp as QueuesApp
    except ImportError:
        return None
    if not isinstance(broker, RedisBroker):
        return None
    queues = QueuesApp(broker=broker, prefix="/queues")

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        inner = {**environ, "PATH_INFO": environ["PATH_INFO"][len("/queues") :] or "/"}
        return queues(inner, start_response)

    return app


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


def serve(app: DashboardApp, host: str = "127.0.0.1", port: int = 8080) -> WSGIServer:
    """A threaded WSGI server for ``app`` (call ``serve_forever()`` or ``shutdown()``)."""
    return make_server(host, port, app, server_class=_ThreadingServer, handler_class=_QuietHandler)
