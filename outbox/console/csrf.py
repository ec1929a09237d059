"""CSRF tokens: one random token a session (kept in the signed session cookie), sent back in
every POST form and compared in constant time. A POST without it, or with another session's,
changes nothing (400)."""

from __future__ import annotations

import hmac
import secrets

from flask import abort, request, session

_KEY = "csrf"


def csrf_token() -> str:
    """The session's token (made on first use); templates put it in every form."""
    token = session.get(_KEY)
    if not isinstance(token, str):
        token = secrets.token_urlsafe(32)
        session[_KEY] = token
    return token


def check_csrf() -> None:
    expected = session.get(_KEY)
    given = request.form.get("csrf_token", "")
    if not isinstance(expected, str) or not hmac.compare_digest(expected, given):
        abort(400, "the form has expired or came from elsewhere: reload the page and try again")
