"""``Maintenance``: the one place that runs the maintenance services, each on its own interval.

Turns run one service after another, in the order given (ends before the prune, the prune
before the gauges, so the gauges count what is left). A service whose turn raises is logged and
waits for its next turn: maintenance never stops the claimer that calls it. A service whose
turn stopped at its bound with work left over (``MaintenanceService.behind``) goes again as long
after that turn as the turn took, not a whole interval later.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from outbox.maintenance.expiry import Expiry
from outbox.maintenance.gauges import BacklogGauges
from outbox.maintenance.lost_claimers import LostClaimers
from outbox.maintenance.lost_leases import LostLeases
from outbox.maintenance.lost_workers import LostWorkers
from outbox.maintenance.operator_rows import ParkedPayloads, StaleProcesses
from outbox.maintenance.retention import Retention
from outbox.maintenance.service import MaintenanceService

if TYPE_CHECKING:
    from outbox.config import Settings
    from outbox.observers import ExecutorObserver
    from outbox.store import Store

# The logger operators already filter on for housekeeping failures.
log = logging.getLogger("outbox.housekeeping")


class Maintenance:
    """Runs each of ``services`` on ``store`` when its interval has passed since its last turn
    (the first turn at the first call)."""

    def __init__(self, store: Store, services: Sequence[MaintenanceService]) -> None:
        self.store = store
        self.services = tuple(services)
        self._next_turn = [0.0] * len(self.services)
        #: Turns run per service name, and turns that failed: for logs and tests.
        self.turns: dict[str, int] = dict.fromkeys((s.name for s in self.services), 0)
        self.failures: dict[str, int] = dict.fromkeys((s.name for s in self.services), 0)

    @classmethod
    def for_claimer(
        cls,
        store: Store,
        settings: Settings,
        observers: Iterable[ExecutorObserver] | None = None,
        claimer: str | None = None,
    ) -> Maintenance:
        """Every service, each every ``settings.housekeeping_interval``; the ends are reported
        to ``observers``. ``claimer``: the claimer's heartbeat process id, which adds the
        giving back of lost claimers' claims and of lost workers' unfenced attempts (before
        the lost leases: what is given back does not wait for its lease)."""
        every = settings.housekeeping_interval
        lost_processes = (
            [
                LostClaimers(every, claimer, settings.heartbeat_interval),
                LostWorkers(every, claimer, settings.heartbeat_interval, settings.lease),
            ]
            if claimer
            else []
        )
        return cls(
            store,
            [
                *lost_processes,
                LostLeases(every, observers=observers),
                Expiry(every, observers=observers),
                Retention(every, settings.retention),
                ParkedPayloads(every, settings.parked_payload_retention),
                StaleProcesses(every, settings.process_stale_after),
                BacklogGauges(every),
            ],
        )

    @classmethod
    def for_drain(
        cls, store: Store, observers: Iterable[ExecutorObserver] | None = None
    ) -> Maintenance:
        """What ``outbox.testing.drain`` needs before each of its rounds: lost leases and expiry,
        at every call (tests prune and read gauges themselves)."""
        return cls(
            store,
            [
                LostLeases(timedelta(0), observers=observers),
                Expiry(timedelta(0), observers=observers),
            ],
        )

    async def run_due(self) -> int:
        """Runs every service whose turn has come; returns how many ran (failed ones included)."""
        ran = 0
        for index, service in enumerate(self.services):
            now = time.monotonic()
            if now < self._next_turn[index]:
                continue
            # Scheduled before the turn, so a failing turn waits a whole interval too.
            self._next_turn[index] = now + service.interval.total_seconds()
            ran += 1
            self.turns[service.name] += 1
            try:
                handled = await service.run(self.store)
            except Exception:
                self.failures[service.name] += 1
                log.exception(service.failure)
                continue
            if service.behind(handled):
                # Work left past the turn's bound: the next turn comes as long after this one
                # as it took (never later than its interval). A backlog then drains in about
                # half the time rather than one bound an interval (retention's 5,000 rows every
                # 5 s fell behind any rate past 1,000 actions/s), and the live work keeps the
                # other half.
                ended = time.monotonic()
                self._next_turn[index] = min(self._next_turn[index], ended + (ended - now))
        return ran
