"""Where a scenario's server time goes, by the outbox's SQL functions: the calls and the time of
each of its schema's functions (its triggers, the lane intake's fold, the claim round's state),
from PostgreSQL's own function statistics (``track_functions``), an action.

The statistics are on only for the scenario's sessions (``PGOPTIONS`` for its processes, the
same option for the enqueuing one), which needs a superuser: as another role the breakdown is left
out (None). A session hands its counts to the shared statistics when it ends, so the scenario's
processes have ended, and their backends with them (``wait_for_backends``), before they are
read.
"""

from __future__ import annotations

import os
import time
from typing import Any

import psycopg

from benchmarks.common import DATABASE_URL

#: Functions of the schema that take less than this an action, in all, are left out.
SHOWN_FROM_MS = 0.001
#: The session setting that turns the function statistics on (superuser only).
TRACK_FUNCTIONS = "-c track_functions=pl"


def application_name(schema: str) -> str:
    """The ``application_name`` of a scenario's sessions: how its backends are found."""
    return f"bench-{schema}"[:63]


def may_track(database_url: str = DATABASE_URL) -> bool:
    """Whether the benchmark's role may turn the function statistics on (a superuser)."""
    with psycopg.connect(database_url) as conn:
        row = conn.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
    return bool(row and row[0])


def tracking(schema: str, database_url: str = DATABASE_URL) -> dict[str, str]:
    """Environment for a scenario's processes that turns the function statistics on in their
    sessions and names them; empty when the benchmark's role may not (``may_track``)."""
    if not may_track(database_url):
        return {}
    options = " ".join(filter(None, (os.environ.get("PGOPTIONS"), TRACK_FUNCTIONS)))
    return {"PGOPTIONS": options, "PGAPPNAME": application_name(schema)}


def session_options(schema: str, settings: dict[str, str]) -> dict[str, Any]:
    """``psycopg.connect`` arguments that count the benchmark's own session (the enqueuer's) as
    the processes' sessions are counted."""
    if not settings:
        return {}
    return {"options": TRACK_FUNCTIONS, "application_name": application_name(schema)}


def wait_for_backends(schema: str, timeout: float = 10.0, database_url: str = DATABASE_URL) -> None:
    """Until no backend of the scenario's processes is left (each flushes its counts as it
    ends); raises after ``timeout`` seconds, as counts read then would leave a session out."""
    deadline = time.monotonic() + timeout
    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                (application_name(schema),),
            ).fetchone()
            left = row[0] if row else 0
            if not left:
                return
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{left} session(s) of {schema} still open after {timeout}s: their "
                    "function statistics would be left out"
                )
            time.sleep(0.05)


def per_action(
    schema: str, n: int, settings: dict[str, str], database_url: str = DATABASE_URL
) -> dict[str, dict[str, float]] | None:
    """Each function of ``schema`` that took time, by its self time an action, most first:
    ``calls`` an action, ``self_ms`` (its own statements) and ``total_ms`` (with the functions
    it called) an action. None when the statistics were off."""
    if not settings or n <= 0:
        return None
    wait_for_backends(schema, database_url=database_url)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        rows = conn.execute(
            "SELECT funcname, calls, total_time, self_time FROM pg_stat_user_functions"
            " WHERE schemaname = %s ORDER BY self_time DESC, funcname",
            (schema,),
        ).fetchall()
    return {
        name: {
            "calls": round(calls / n, 3),
            "self_ms": round(self_ms / n, 4),
            "total_ms": round(total_ms / n, 4),
        }
        for name, calls, total_ms, self_ms in rows
        if total_ms / n >= SHOWN_FROM_MS
    }
