"""The registry of claimer and worker processes: each upserts its row of ``outbox_process``
every ``OUTBOX_HEARTBEAT_INTERVAL`` (``outbox.dispatch.heartbeat``), off its hot path; a process
is live while its last heartbeat is recent. Maintenance deletes rows long silent."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from psycopg import Connection

from outbox._io import Operation, Statement, run_sync
from outbox.enqueuing import default_schema
from outbox.operator.records import LiveProcess
from outbox.queries import queries_for

#: A process is live while its last heartbeat is at most this many heartbeat intervals old.
LIVE_INTERVALS = 3
#: A beat written more than this many heartbeat intervals after the one before breaks its
#: process's unbroken run (``outbox_process.beating_since``): it waited through a database
#: outage, or its process stalled. An outage too short to break a run silences another process
#: for at most 2.5 intervals, short of the ``LIVE_INTERVALS`` that make it lost.
BEAT_GAP = 1.5


def beat_gap(heartbeat_interval: timedelta) -> timedelta:
    """How late a beat may come and still continue its process's unbroken run."""
    return heartbeat_interval * BEAT_GAP


def live_processes_operation(schema: str, within: timedelta) -> Operation[list[LiveProcess]]:
    rows = yield Statement(queries_for(schema)["live_processes"], {"within": within})
    return [LiveProcess(**r) for r in rows]


def live_processes(
    conn: Connection[Any], *, within: timedelta | None = None, schema: str | None = None
) -> list[LiveProcess]:
    """Claimers and workers whose last heartbeat is at most ``within`` old (by default three
    heartbeat intervals of the settings in the environment), claimers first, then by host and
    pid."""
    if within is None:
        from outbox.config import Settings

        within = Settings.from_env().heartbeat_interval * LIVE_INTERVALS
    return run_sync(conn, live_processes_operation(schema or default_schema(), within))
