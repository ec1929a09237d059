"""A worker process's health from its Dramatiq consumers (``outbox.health``).

Each consumer thread asks its broker consumer for the next message at least once a
``worker_timeout`` (1 s by default) even while its queue is empty: an answer, a message or an
idle poll, is the thread consuming (``ok``); an error is the broker gone (``trouble``, until an
answer again; Dramatiq restarts the consumer every 3 s, each restart a ``beat``). A process
that stops (SIGSTOP, a deadlock) stops answering and goes stale.

With ``health_port`` set, one forked process (as the metrics fork) serves the pool's verdict
from every worker process's health file.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dramatiq import Broker
from dramatiq.middleware import Middleware

from outbox.config import Settings
from outbox.connecting import one_line
from outbox.health import ProcessHealth, process_health, role_verdict, start_health_server


class WatchedConsumer:
    """A Dramatiq consumer whose fetches report to ``health`` as the part ``part``."""

    def __init__(self, inner: Any, health: ProcessHealth, part: str) -> None:
        self._inner = inner
        self._health = health
        self._part = part

    def __iter__(self) -> WatchedConsumer:
        return self

    def __next__(self) -> Any:
        try:
            message = next(self._inner)
        except StopIteration:
            raise
        except Exception as error:
            self._health.trouble(self._part, f"broker: {one_line(error)}")
            raise
        self._health.ok(self._part)
        return message

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def watch_consumers(broker: Broker, health: ProcessHealth) -> None:
    """Makes ``broker.consume`` (in this process) hand out consumers that report to ``health``."""
    consume: Callable[..., Any] = broker.consume

    def watched(queue_name: str, *args: Any, **kwargs: Any) -> WatchedConsumer:
        part = f"consumer {queue_name}"
        try:
            inner = consume(queue_name, *args, **kwargs)
        except Exception as error:  # a broker that connects here (RabbitMQ) and is gone
            health.trouble(part, f"broker: {one_line(error)}")
            raise
        health.beat(part)
        return WatchedConsumer(inner, health, part)

    broker.consume = watched  # type: ignore[method-assign,assignment]


class ConsumerHealth(Middleware):
    """Gives each worker process a health file fed by its consumers (``health_dir`` set)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.health: ProcessHealth | None = None

    def before_worker_boot(self, broker: Broker, worker: Any) -> None:
        self.health = process_health("worker", self.settings)
        self.health.publish()
        watch_consumers(broker, self.health)

    def after_worker_shutdown(self, broker: Broker, worker: Any) -> None:
        if self.health is not None:
            self.health.close()

    @property
    def forks(self) -> list[Callable[[], int]]:
        return [serve_pool_health] if self.settings.health_port else []


def serve_pool_health() -> int:
    """A Dramatiq fork function: ``/livez`` and ``/readyz`` of the whole pool (every worker
    process's health file) on ``$OUTBOX_HEALTH_HOST:$OUTBOX_HEALTH_PORT``."""
    settings = Settings.from_env()
    if not (settings.health_port and settings.health_dir):
        return 0
    directory = Path(settings.health_dir)
    start_health_server(
        lambda: role_verdict(directory, "worker"), settings.health_port, settings.health_host
    )
    while True:  # the server thread serves; Dramatiq's SIGTERM handler ends this process
        time.sleep(3600)
