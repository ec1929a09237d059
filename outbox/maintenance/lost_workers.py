"""Lost workers: the attempts of a worker killed between its take and its fence.

A worker takes an action (its attempt counts from there), runs the adapter, and the adapter
passes its fence right before the provider call. Killed before the fence (SIGKILL, an OOM kill,
its machine gone), the worker leaves attempts that nobody will finish: without this, each waits
out its lease (5 minutes by default) before a claimer reclaims it. Each take names its worker
(``agent_action.taken_by``: the worker process's heartbeat process id), so every claimer's
housekeeping gives back the taken, unfenced attempts of a worker whose heartbeat has been silent
for as long as ``outbox status`` takes to call a process gone (three heartbeat intervals), while
the claimer's own beats ran unbroken as long (``lost_processes``: a database outage silences the
live workers too): due again at once, the attempt counted, as the lease's end would have left
them.

An attempt that passed its fence is never touched: its write may have started, and the lease and
the kind's rules decide (an at-most-once one ends UNCERTAIN, a read-back one reads back first).
A worker that only stalled that long (a loop blocked by a synchronous adapter, a paused VM) finds
its fences and finishes refused when it resumes, so an effect never runs twice; what it costs is
the attempt, as a lease that ran out would.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from outbox.maintenance.lost_processes import report_given_back
from outbox.maintenance.service import MaintenanceService
from outbox.operator.processes import LIVE_INTERVALS, beat_gap
from outbox.store import release_lost_attempts_operation

if TYPE_CHECKING:
    from outbox.store import Store


class LostWorkers(MaintenanceService):
    """Gives back the taken, unfenced attempts of workers silent for ``heartbeat_interval``
    times ``LIVE_INTERVALS``, and silent for less than that plus ``lease`` (after which every
    attempt such a worker took has outlived its lease and is reclaimed as any other);
    ``claimer`` is the calling claimer's own heartbeat process id."""

    name = "lost_workers"
    failure = "giving back a lost worker's attempts failed; trying again at the next housekeeping"

    def __init__(
        self, interval: timedelta, claimer: str, heartbeat_interval: timedelta, lease: timedelta
    ) -> None:
        super().__init__(interval)
        self.claimer = claimer
        self.silent = heartbeat_interval * LIVE_INTERVALS
        self.gap = beat_gap(heartbeat_interval)
        # The take that starts a lease comes at most a heartbeat after the worker's last beat.
        self.within = self.silent + heartbeat_interval + lease

    async def run(self, store: Store) -> int:
        lost = await store.run(
            release_lost_attempts_operation(
                store.schema, self.claimer, self.silent, self.within, self.gap
            )
        )
        given_back = [(attempt.worker, attempt.kind) for attempt in lost]
        report_given_back(
            "worker_lost",
            "worker",
            given_back,
            self.silent,
            "attempts that had not passed their fence",
        )
        return len(lost)
