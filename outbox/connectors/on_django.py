"""Django: the DB-API connection (psycopg 3 or psycopg2) under Django's connection for an
alias, inside the ``transaction.atomic()`` block the application opened.

Outside an atomic block Django's connection commits every statement on its own, so the action
would be committed whether or not the application's change is: that is refused. A database
error in an outbox statement marks the atomic block for rollback, as an error in Django's own
queries does, so the application cannot commit a half-done unit of work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from outbox.errors import UnusableConnection

T = TypeVar("T")


def is_django(conn: Any) -> bool:
    # django.db.connection is a ConnectionProxy (django.utils.connection) that forwards to the
    # DatabaseWrapper of the default alias (django.db.backends.*).
    module = type(conn).__module__
    return module.startswith("django.db.backends") or (
        module.startswith("django.") and type(conn).__name__ == "ConnectionProxy"
    )


def driver_connection(wrapper: Any, caller: str) -> Any:
    """The psycopg or psycopg2 connection under ``wrapper``, inside its atomic block."""
    if wrapper.vendor != "postgresql":
        raise UnusableConnection(
            f"{caller} cannot use Django's {wrapper.vendor} connection {wrapper.alias!r}: the "
            "outbox's tables live in PostgreSQL"
        )
    if not wrapper.in_atomic_block:
        raise UnusableConnection(
            f"{caller} needs a transaction on Django's connection {wrapper.alias!r}: call it "
            "inside `with transaction.atomic():` (in autocommit it would commit on its own)"
        )
    wrapper.validate_no_broken_transaction()
    wrapper.ensure_connection()
    return wrapper.connection


def run_marking_rollback(wrapper: Any, call: Callable[[], T]) -> T:
    """``call()``; a database error in it marks ``wrapper``'s atomic block for rollback."""
    try:
        return call()
    except wrapper.Database.Error:
        wrapper.needs_rollback = True
        raise
