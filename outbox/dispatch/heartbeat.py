"""Each claimer and worker process says it is alive: a row of ``outbox_process`` upserted every
``heartbeat_interval`` on a pooled connection of its own, beside the claims and attempts (never
in one of their statements), and deleted when the process stops cleanly. ``outbox status``, the
console and ``/healthz`` read the registry (``outbox.operator.live_processes``); maintenance
deletes the rows of processes long silent (a SIGKILLed one leaves its row behind).

Each row also keeps when its process's unbroken run of beats began (``beating_since``; a beat
more than ``BEAT_GAP`` intervals after the last starts a new one): a claimer judges another
process lost only while its own run has lasted as long as that process's silence, since a
database outage silences every process at once (``outbox.maintenance.lost_processes``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import psycopg

from outbox._io import Operation, Statement
from outbox.connecting import one_line
from outbox.operator.processes import beat_gap
from outbox.queries import queries_for

if TYPE_CHECKING:
    from outbox.store import Store

log = logging.getLogger("outbox.heartbeat")


class Heartbeat:
    """One process's heartbeat. ``in_flight`` says how many attempts (a worker) or claims (a
    claimer) it has in flight now."""

    def __init__(
        self,
        store: Store,
        role: str,
        kinds: Iterable[str],
        in_flight: Callable[[], int],
        interval: float,
    ) -> None:
        self.store = store
        self.role = role
        self.kinds = sorted(kinds)
        self.in_flight = in_flight
        self.interval = interval
        self.host = socket.gethostname()
        self.pid = os.getpid()
        self.started_at = datetime.now(UTC)
        self.process_id = f"{self.host}:{self.pid}:{int(self.started_at.timestamp() * 1000)}"
        self._failing = False

    async def beat(self) -> bool:
        """One upsert; a failure is logged (once until it works again), never raised."""
        params = {
            "process_id": self.process_id,
            "role": self.role,
            "host": self.host,
            "pid": self.pid,
            "kinds": self.kinds,
            "started_at": self.started_at,
            "in_flight": max(0, self.in_flight()),
            "gap": beat_gap(timedelta(seconds=self.interval)),
        }
        try:
            await self.store.run(_statement(self.store.schema, "heartbeat", params))
        except (psycopg.Error, OSError) as error:
            if not self._failing:
                log.warning("heartbeat failed (%s); trying again", one_line(error))
            self._failing = True
            return False
        if self._failing:
            log.info("heartbeat recorded again")
        self._failing = False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Beats every ``interval`` until ``stop``; then takes the row away."""
        while not stop.is_set():
            await self.beat()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=self.interval)
        await self.forget()

    async def forget(self) -> None:
        """Deletes this process's row (a clean stop); a failure leaves it to maintenance."""
        try:
            await self.store.run(
                _statement(self.store.schema, "process_gone", {"process_id": self.process_id})
            )
        except (psycopg.Error, OSError) as error:
            log.info("could not remove the heartbeat row (%s)", one_line(error))


def _statement(schema: str, name: str, params: dict[str, object]) -> Operation[None]:
    yield Statement(queries_for(schema)[name], params)
