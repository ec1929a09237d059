"""The console's WSGI application: login, CSRF, security headers, and the pages (``views``,
``acting``) on one PostgreSQL pool; dramatiq-dashboard under ``/queues`` (``queues``)."""

from __future__ import annotations

import getpass
import logging
import secrets
from datetime import timedelta
from typing import Any

import psycopg
from flask import Flask, abort, g, redirect, render_template, request, session, url_for
from psycopg_pool import ConnectionPool, PoolTimeout
from werkzeug.wrappers import Response

from outbox.console import acting, views
from outbox.console.auth import parse_users
from outbox.console.csrf import check_csrf, csrf_token
from outbox.console.queues import queues_app
from outbox.provider_outage import DEFAULT_RULE, OutageRule

log = logging.getLogger("outbox.console")

#: Requests that need no login: the login form itself, the probe, the static files.
_OPEN_ENDPOINTS = frozenset({"views.login", "views.healthz", "static"})

#: What a console page may load: itself only (no CDN, no inline script).
_CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "frame-ancestors 'none'; form-action 'self'; base-uri 'none'"
)


def create_app(
    pool: ConnectionPool,
    schema: str,
    *,
    broker: Any = None,
    users: dict[str, str] | str | None = None,
    secret_key: str | None = None,
    outage_rule: OutageRule = DEFAULT_RULE,
) -> Flask:
    """The console on ``pool`` and ``schema``. ``users`` (name -> password or werkzeug hash, or
    the ``OUTBOX_CONSOLE_USERS`` string): without any, nobody logs in and every action is
    recorded as the OS user running the console, which is why it then listens on loopback only
    (``outbox.console.server``). ``outage_rule`` as the executors' ``Settings.outage_rule``
    (whether a kind's retrying provider is shown as down)."""
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY=secret_key or secrets.token_urlsafe(32),
        SESSION_COOKIE_NAME="outbox_console",
        SESSION_COOKIE_HTTPONLY=True,
        SESSION_COOKIE_SAMESITE="Strict",
        PERMANENT_SESSION_LIFETIME=timedelta(hours=12),
        MAX_CONTENT_LENGTH=64 * 1024,
    )
    app.extensions["outbox"] = {
        "pool": pool,
        "schema": schema,
        "users": users if isinstance(users, dict) else parse_users(users),
        "queues": queues_app(broker),
        "os_user": _os_user(),
        "outage_rule": outage_rule,
    }
    app.jinja_env.globals["csrf_token"] = csrf_token
    app.jinja_env.globals["bulk_labels"] = acting.BULK_LABELS
    app.jinja_env.autoescape = True
    app.register_blueprint(views.blueprint)
    app.register_blueprint(acting.blueprint)
    app.register_error_handler(psycopg.OperationalError, _database_down)
    app.register_error_handler(PoolTimeout, _database_down)
    app.before_request(_require_login)
    app.after_request(_headers)
    return app


def _os_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "unknown"


def _require_login() -> Response | None:
    """Every page but the open ones needs a login when logins are configured; every POST needs
    the session's CSRF token. ``g.actor`` is who acts: the login, else the OS user."""
    state = views.state()
    endpoint = request.endpoint or ""
    user = session.get("user") if state["users"] else None
    if state["users"] and user not in state["users"] and endpoint not in _OPEN_ENDPOINTS:
        session.pop("user", None)
        if request.method == "GET":
            return redirect(url_for("views.login", next=request.full_path.rstrip("?")))
        abort(401)
    g.actor = user if state["users"] else state["os_user"]
    g.login_required = bool(state["users"])
    if request.method == "POST":
        check_csrf()
    return None


def _database_down(error: Exception) -> tuple[str, int]:
    """A page that could not be read: 503 with the reason's class (never its text, which may
    carry a host or a query), so the refresh keeps showing the last data and says why."""
    log.warning("console: the database could not be read (%s)", type(error).__name__)
    page = render_template(
        "unavailable.html", refresh=0, states=views.STATES, error=type(error).__name__
    )
    return page, 503


def _headers(response: Response) -> Response:
    if not request.path.startswith("/queues"):
        response.headers.setdefault("Content-Security-Policy", _CSP)
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "same-origin")
        if response.mimetype == "text/html":
            response.headers.setdefault("Cache-Control", "no-store")
    return response
