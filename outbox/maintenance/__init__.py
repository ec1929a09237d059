"""Maintenance: the bounded background services that keep the table honest and small.

One module a service, each with its own interval and its own bound on what one turn does:

- ``lost_claimers``, ``lost_workers`` (a claimer's only): the untaken claims of a claimer, and
  the taken, unfenced attempts of a worker, whose heartbeat stopped are due again at once;
- ``lost_leases``: executing actions whose lease ran out and that may not run again end
  (UNCERTAIN after a write started, else FAILED ``ATTEMPTS_EXHAUSTED``);
- ``expiry``: waiting actions past their ``expires_at`` end CANCELLED ``EXPIRED``;
- ``retention``: actions ended more than ``Settings.retention`` ago are deleted;
- ``gauges``: the backlog gauges are read from the database and set.

``Maintenance`` (``runner``) is the one place that starts them: the claimer calls ``run_due``
before each claim round, ``outbox.testing.drain`` before each of its rounds. A service that
fails logs one line and waits for its next turn; it never stops the caller.
"""

from outbox.maintenance.ended import EndedByHousekeeping
from outbox.maintenance.expiry import Expiry
from outbox.maintenance.gauges import BacklogGauges, refresh_backlog_gauges
from outbox.maintenance.lost_leases import LostLeases
from outbox.maintenance.retention import Retention
from outbox.maintenance.runner import Maintenance
from outbox.maintenance.service import MaintenanceService

__all__ = [
    "BacklogGauges",
    "EndedByHousekeeping",
    "Expiry",
    "LostLeases",
    "Maintenance",
    "MaintenanceService",
    "Retention",
    "refresh_backlog_gauges",
]
