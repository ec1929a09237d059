"""Lost claimers: the claims of a claimer killed between its claim's commit and its push.

A claimer commits its claims, then pushes them. Killed in between (SIGKILL, an OOM kill, its
machine gone), it leaves claims that no broker holds: without this, each waits out its lease
(5 minutes by default) counted in flight, and then stalls its kind as unconsumed until a probe
goes round. Each claim names its claimer (``agent_action.claimed_by``: the heartbeat process id),
so every live claimer's housekeeping gives back the untaken claims of a claimer whose heartbeat
has been silent for as long as ``outbox status`` takes to call a process gone (three heartbeat
intervals, while its own beats ran unbroken as long: ``lost_processes``): they are due again at
once, same epoch, no attempt spent. A message of such a claim
that did reach the broker is dropped by the worker's take; a claimer that was only paused and
pushes later pushes tokens whose claims moved on. Either costs a message, never a run.
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from outbox.maintenance.lost_processes import report_given_back
from outbox.maintenance.service import MaintenanceService
from outbox.operator.processes import LIVE_INTERVALS, beat_gap
from outbox.store import release_lost_claims_operation

if TYPE_CHECKING:
    from outbox.store import Store


class LostClaimers(MaintenanceService):
    """Gives back the untaken claims of claimers silent for ``heartbeat_interval`` times
    ``LIVE_INTERVALS``; ``claimer`` is the calling claimer's own heartbeat process id."""

    name = "lost_claimers"
    failure = "giving back a lost claimer's claims failed; trying again at the next housekeeping"

    def __init__(self, interval: timedelta, claimer: str, heartbeat_interval: timedelta) -> None:
        super().__init__(interval)
        self.claimer = claimer
        self.silent = heartbeat_interval * LIVE_INTERVALS
        self.gap = beat_gap(heartbeat_interval)

    async def run(self, store: Store) -> int:
        lost = await store.run(
            release_lost_claims_operation(store.schema, self.claimer, self.silent, self.gap)
        )
        given_back = [(claim.claimer, claim.kind) for claim in lost]
        report_given_back(
            "claimer_lost", "claimer", given_back, self.silent, "claims no worker had taken"
        )
        return len(lost)
