"""``/healthz``: whether the database answers, and which claimers and workers are alive, within
a hard deadline (a database that is down, or stopped mid-answer, must not hang the probe)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

from psycopg_pool import ConnectionPool

log = logging.getLogger("outbox.console")

#: The probe answers within this, whatever the database does (seconds).
DEADLINE = 1.5

# Its own threads: a check stuck on a dead socket keeps one of them, never a request thread.
_checks = ThreadPoolExecutor(max_workers=4, thread_name_prefix="outbox-console-health")

ProcessReader = Callable[[Any], list[dict[str, Any]]]


def health(
    pool: ConnectionPool, processes: ProcessReader | None, deadline: float = DEADLINE
) -> tuple[bool, dict[str, Any]]:
    """``(healthy, report)``. The report says whether the database answered and, when it did,
    the live claimers and workers (from their heartbeats)."""

    def check() -> dict[str, Any]:
        with pool.connection(timeout=deadline) as conn:
            conn.execute("SELECT 1")
            alive = processes(conn) if processes else []
        return {"database": "ok", "processes": alive}

    future = _checks.submit(check)
    try:
        report = future.result(timeout=deadline)
    except FutureTimeout:
        return False, {"database": f"no answer within {deadline}s", "processes": None}
    except Exception as error:
        log.warning("healthz: the database check failed (%s)", type(error).__name__)
        return False, {"database": f"unreachable ({type(error).__name__})", "processes": None}
    return True, report
