"""A Celery worker's health (``outbox.health``): the same health file and ``outbox health
--role worker`` probe as a Dramatiq worker process.

A step of the worker's consumer blueprint starts one daemon thread in the worker's main process
(the one that consumes; a prefork child only runs tasks). Every ``LOOK_EVERY`` seconds it looks
at the consumer's broker connection: connected is the worker consuming (``ok``); no connection
(Celery is reconnecting after the broker went away) is ``trouble`` until it is back. The thread
keeps beating while the consumer reconnects, so a broker outage makes the worker unready, not
dead (nothing for a liveness probe to restart); a stopped process (SIGSTOP) stops beating and
goes stale. Unlike a Dramatiq consumer, whose every fetch reports, a consumer wedged with its
connection up is not seen here.
"""

from __future__ import annotations

import threading
from typing import Any

from celery import bootsteps

from outbox.config import Settings
from outbox.health import ProcessHealth, process_health

#: How often the thread looks at the consumer's connection (seconds): well inside any staleness.
LOOK_EVERY = 1.0
#: The part of the health file this step reports as.
PART = "consumer"


def connection_state(consumer: Any) -> str | None:
    """None while ``consumer`` holds a connected broker connection, else why not."""
    connection = getattr(consumer, "connection", None)
    if connection is None:
        return "broker: not connected (the consumer is reconnecting)"
    try:
        connected = bool(connection.connected)
    except Exception as error:  # a transport that fails to say
        return f"broker: {type(error).__name__}"
    return None if connected else "broker: connection lost"


class ConsumerHealth(bootsteps.StartStopStep):
    """Reports the consumer's connection to this process's health file (``health_dir`` set)."""

    label = "outbox health"

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self.health: ProcessHealth | None = None
        self.consumer: Any = None
        self._stopped = threading.Event()

    def start(self, consumer: Any) -> None:
        # Called again after each reconnect: the thread is started once and reads the current
        # consumer's connection each time it looks.
        self.consumer = consumer
        if self.health is not None:
            return
        settings = Settings.from_env()
        if not settings.health_dir:
            return
        self.health = process_health("worker", settings)
        self.health.publish()
        threading.Thread(target=self._look, name="outbox-health", daemon=True).start()

    def _look(self) -> None:
        assert self.health is not None
        while not self._stopped.wait(LOOK_EVERY):
            problem = connection_state(self.consumer)
            if problem is None:
                self.health.ok(PART)
            else:
                self.health.trouble(PART, problem)

    def shutdown(self, consumer: Any) -> None:
        self._stopped.set()
        if self.health is not None:
            self.health.close()
