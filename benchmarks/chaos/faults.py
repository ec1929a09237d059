"""The faults the soak schedules among its random SIGKILLs, besides them: a broker restart (its
queued messages are lost), a database restart (every open connection breaks), and a worker-pool
outage longer than a lease (claimers keep running, nothing consumes their pushes).

Each is committed to ``<watch>.fault`` with the database clock just before it began and just
after it ended. Server restarts need the soak's private servers (``servers``); on shared servers
only the outage is scheduled.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks.chaos.checks import BROKER_RESTART, DATABASE_RESTART, WORKER_OUTAGE
from benchmarks.chaos.fleet import Fleet
from benchmarks.chaos.servers import PrivatePostgres, PrivateRedis

#: Seconds each server stays down in its restart.
BROKER_DOWNTIME = 1.0
DATABASE_DOWNTIME = 2.0
#: The worker-pool outage lasts this many leases.
OUTAGE_LEASES = 1.5


@dataclass(frozen=True)
class Fault:
    name: str
    #: When it begins, in seconds from the start of the chaos phase.
    at: float
    #: How long the server or the pool stays down.
    length: float


def schedule(duration: float, lease: float, servers: bool) -> list[Fault]:
    """A broker restart at 15% of the run, a database restart at 30%, a worker-pool outage of
    OUTAGE_LEASES leases from 45%: early enough that the backlog they leave drains while the
    kills go on."""
    plan = [Fault(WORKER_OUTAGE, 0.45 * duration, OUTAGE_LEASES * lease)]
    if servers:
        plan = [
            Fault(BROKER_RESTART, 0.15 * duration, BROKER_DOWNTIME),
            Fault(DATABASE_RESTART, 0.3 * duration, DATABASE_DOWNTIME),
            *plan,
        ]
    return plan


def db_now(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


class Injector:
    """Injects the faults of a schedule as their time comes (``tick``), one at a time."""

    def __init__(
        self,
        plan: list[Fault],
        fleet: Fleet,
        watch: str,
        pg: PrivatePostgres | None,
        broker: PrivateRedis | None,
        reconnect: Callable[[], psycopg.Connection[Any]],
        log: Callable[[str], None],
    ) -> None:
        self.pending = sorted(plan, key=lambda f: f.at)
        self.fleet = fleet
        self.table = f'"{watch}".fault'
        self.pg = pg
        self.broker = broker
        self.reconnect = reconnect
        self.log = log
        #: The outage in progress: when its workers come back, and its start by the db clock.
        self._outage: tuple[float, Any] | None = None

    @property
    def busy(self) -> bool:
        """A fault is in progress (random kills wait meanwhile)."""
        return self._outage is not None

    def tick(self, elapsed: float, conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
        """Begins a due fault or ends an outage; returns the harness's connection (a new one
        after a database restart)."""
        if self._outage is not None:
            until, before = self._outage
            if time.monotonic() >= until:
                self.fleet.pool_up()
                self._record(conn, WORKER_OUTAGE, before)
                self.log("worker pool back")
                self._outage = None
            return conn
        if not self.pending or elapsed < self.pending[0].at:
            return conn
        fault = self.pending.pop(0)
        before = db_now(conn)
        if fault.name == WORKER_OUTAGE:
            down = self.fleet.pool_down()
            self._outage = (time.monotonic() + fault.length, before)
            self.log(f"worker pool down ({down} SIGKILLed) for {fault.length:.0f}s")
            return conn
        server = self.pg if fault.name == DATABASE_RESTART else self.broker
        assert server is not None, f"{fault.name} needs the soak's private servers"
        server.restart(downtime=fault.length)
        if fault.name == DATABASE_RESTART:
            conn = self.reconnect()
        self._record(conn, fault.name, before)
        self.log(f"{fault.name}: down {fault.length:.0f}s")
        return conn

    def _record(self, conn: psycopg.Connection[Any], name: str, before: Any) -> None:
        conn.execute(
            f"INSERT INTO {self.table} (name, before, after) VALUES (%s, %s, clock_timestamp())",
            (name, before),
        )
