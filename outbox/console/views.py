"""The console's pages that read: overview, actions (filtered, keyset-paged), one action,
UNCERTAIN, blocked lanes, processes; and login, logout, /healthz, /queues."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import (
    Blueprint,
    abort,
    current_app,
    g,
    jsonify,
    redirect,
    render_template,
    request,
    session,
    url_for,
)
from markupsafe import Markup
from psycopg import Connection
from werkzeug.wrappers import Response

from outbox._io import run_sync
from outbox.console import reads
from outbox.console.auth import check_login
from outbox.console.chart import outcomes_svg
from outbox.console.health import health
from outbox.console.queues import serve_queues
from outbox.errors import ActionNotFound
from outbox.operator import action_record, live_processes, paused_kinds, recent_audit
from outbox.provider_outage import OutageRule
from outbox.queries import queries_for
from outbox.state import ActionState
from outbox.status import status_operation
from outbox.vacuum_horizon import describe_holder, listing_rule

blueprint = Blueprint("views", __name__)

#: Data regions refresh this often (seconds); the page itself never reloads.
REFRESH_SECONDS = 5
STATES = [s.value for s in ActionState]


def state() -> dict[str, Any]:
    found: dict[str, Any] = current_app.extensions["outbox"]
    return found


@contextmanager
def connection() -> Iterator[Connection[Any]]:
    """A pooled connection that commits what an operator verb wrote (autocommit: each verb runs
    in its own ``conn.transaction()``)."""
    with state()["pool"].connection(timeout=5) as conn:
        conn.autocommit = True
        yield conn


def _page(template: str, **context: Any) -> str:
    return render_template(template, refresh=REFRESH_SECONDS, states=STATES, **context)


@blueprint.route("/")
def overview() -> str:
    schema = state()["schema"]
    with connection() as conn:
        report = run_sync(conn, status_operation(schema))
        chart = _chart(conn, schema)
        paused = {p.kind: p for p in paused_kinds(conn, schema=schema)}
        processes = live_processes(conn, schema=schema)
        lanes = reads.blocked_lanes(conn, schema, limit=10)
        uncertain = reads.uncertain_page(conn, schema, unresolved=True, limit=10)
    kinds = sorted(set(report.counts) | set(report.backlog))
    rule: OutageRule = state()["outage_rule"]
    outages = {
        kind: rule.verdict(b["retrying"], b["retrying_for"])
        for kind, b in report.backlog.items()
        if b.get("retrying")
    }
    return _page(
        "overview.html",
        report=report,
        kinds=kinds,
        outages=outages,
        outage_threshold=rule.threshold,
        chart=chart,
        paused=paused,
        processes=processes,
        lanes=lanes,
        uncertain=uncertain,
        horizon=[describe_holder(holder) for holder in report.vacuum_horizon],
        listed_when=listing_rule(),
        schema=schema,
    )


#: The chart is read at most this often (seconds) by one console process, whoever watches:
#: counting an hour of ended actions is the overview's costliest read under a high throughput.
CHART_SECONDS = 15.0
_chart_lock = threading.Lock()
_charts: dict[str, tuple[float, Markup]] = {}


def _chart(conn: Connection[Any], schema: str) -> Markup:
    with _chart_lock:
        cached = _charts.get(schema)
        if cached is not None and time.monotonic() - cached[0] < CHART_SECONDS:
            return cached[1]
        chart = outcomes_svg(reads.outcomes_per_minute(conn, schema))
        _charts[schema] = (time.monotonic(), chart)
        return chart


@blueprint.route("/actions/")
def actions() -> str | Response:
    query = (request.args.get("q") or "").strip()
    if query:  # the search box: an action id goes straight to its page
        match = re.fullmatch(r"#?(\d{1,18})", query)
        if match:
            return redirect(url_for("views.action", action_id=int(match[1])))
    where = reads.ActionFilter.from_args(request.args)
    before = request.args.get("before", type=int)
    with connection() as conn:
        page = reads.actions_page(conn, state()["schema"], where, before)
    return _page("actions.html", page=page, where=where, before=before)


@blueprint.route("/actions/<int:action_id>")
def action(action_id: int) -> tuple[str, int] | str:
    schema = state()["schema"]
    with connection() as conn:
        try:
            record = action_record(conn, action_id, schema=schema)
        except ActionNotFound:
            return _page("missing.html", action_id=action_id), 404
        lane = conn.execute(
            queries_for(schema)["lane_of_action"],
            {"id": action_id, "lane_key": record.action.lane_key},
        ).fetchone()
        paused = {p.kind for p in paused_kinds(conn, schema=schema)}
        audit = recent_audit(conn, action_id=action_id, limit=20, schema=schema)
    return _page(
        "action.html", record=record, a=record.action, lane=lane, paused=paused, audit=audit
    )


@blueprint.route("/uncertain/")
def uncertain() -> str:
    before = request.args.get("before", type=int)
    unresolved = request.args.get("all") is None
    with connection() as conn:
        rows = reads.uncertain_page(conn, state()["schema"], unresolved=unresolved, before=before)
    older = rows[-1]["id"] if len(rows) == reads.PAGE_SIZE else None
    return _page("uncertain.html", rows=rows, unresolved=unresolved, older=older)


@blueprint.route("/lanes/")
def lanes() -> str:
    with connection() as conn:
        rows = reads.blocked_lanes(conn, state()["schema"])
    return _page("lanes.html", lanes=rows)


@blueprint.route("/processes/")
def processes() -> str:
    with connection() as conn:
        rows = live_processes(conn, schema=state()["schema"])
    return _page("processes.html", processes=rows)


@blueprint.route("/audit/")
def audit() -> str:
    with connection() as conn:
        rows = recent_audit(conn, limit=100, schema=state()["schema"])
    return _page("audit.html", audit=rows)


@blueprint.route("/healthz")
def healthz() -> tuple[Response, int]:
    """200 while the database answers, 503 otherwise, within 2 s either way; with the claimers
    and workers alive by their heartbeats."""
    schema = state()["schema"]

    def alive(conn: Any) -> list[dict[str, Any]]:
        return [
            {
                "role": p.role,
                "host": p.host,
                "pid": p.pid,
                "kinds": p.kinds,
                "last_seen_seconds_ago": round(p.age, 1),
                "in_flight": p.in_flight,
            }
            for p in live_processes(conn, schema=schema)
        ]

    healthy, report = health(state()["pool"], alive)
    processes = report.get("processes") or []
    report["claimers"] = sum(p["role"] == "claimer" for p in processes)
    report["workers"] = sum(p["role"] == "worker" for p in processes)
    return jsonify({"status": "ok" if healthy else "unavailable", **report}), (
        200 if healthy else 503
    )


@blueprint.route("/login", methods=["GET", "POST"])
def login() -> str | Response | tuple[str, int]:
    users = state()["users"]
    if not users:
        return redirect(url_for("views.overview"))
    target = request.values.get("next") or "/"
    if not target.startswith("/") or target.startswith("//"):
        target = "/"  # never a redirect off the console
    if request.method == "POST":
        name = request.form.get("name", "")
        if check_login(users, name, request.form.get("password", "")):
            csrf = session.get("csrf")
            session.clear()  # a fresh session at login
            session["user"] = name
            if csrf:
                session["csrf"] = csrf
            session.permanent = True
            return redirect(target)
        return _page("login.html", failed=True, next=target), 401
    return _page("login.html", failed=False, next=target)


@blueprint.route("/logout", methods=["POST"])
def logout() -> Response:
    session.clear()
    return redirect(url_for("views.login"))


@blueprint.route("/queues", defaults={"rest": ""}, methods=["GET", "POST"])
@blueprint.route("/queues/", defaults={"rest": ""}, methods=["GET", "POST"])
@blueprint.route("/queues/<path:rest>", methods=["GET", "POST"])
def queues(rest: str) -> Response | tuple[str, int]:
    app = state()["queues"]
    if app is None:
        return _page("noqueues.html"), 404
    if request.method == "POST":
        abort(405)  # dramatiq-dashboard's own actions carry no CSRF token
    return serve_queues(app, request.environ)


@blueprint.app_template_filter("when")
def when(value: Any) -> str:
    """A time to the second in UTC (the console's zone), or a dash."""
    if value is None:
        return "-"
    return value.strftime("%Y-%m-%d %H:%M:%S")


@blueprint.app_context_processor
def actor() -> dict[str, Any]:
    return {"actor": g.get("actor"), "login_required": g.get("login_required", False)}
