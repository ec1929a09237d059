"""The claimer's side of the broker: pushes off the event loop, and a gate that stops claims
while the broker does not answer.

A push through a broker's own client is a blocking network call (Redis, RabbitMQ). Run on the
claimer's event loop, a broker that stalls would freeze claims, housekeeping and gauges with it;
so such a push (and every broker check) runs on a small thread pool and counts as failed after
``push_timeout``. (A fabric with an asyncio client pushes on the loop instead, under the same
bound: ``Fabric.loop_push``, ``outbox.dispatch.redis_push``.) What a
failed push carried is given back at once (``release_claims``), and the ``BrokerGate`` stays
closed, so the claimer claims nothing, until a check finds the broker answering again
(checks back off, each one logged in one line).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from dramatiq import Broker
from dramatiq.brokers.redis import RedisBroker

from outbox.connecting import backoff, one_line, sleep_unless_stopped

log = logging.getLogger("outbox.claimer")

T = TypeVar("T")

#: Threads for pushes and checks: a stalled push holds one until the broker client's own
#: socket timeout, so a second keeps the next push (or check) from queueing behind it.
PUSH_THREADS = 2


class PushTimeout(Exception):
    """A push or broker check took longer than ``push_timeout``."""


def check_broker(broker: Broker) -> None:
    """Raises unless the Dramatiq broker answers: a Redis PING, a RabbitMQ connection's
    heartbeat round.

    A broker of another type (an application's own) is taken as answering.
    """
    if isinstance(broker, RedisBroker):
        broker.client.ping()
        return
    try:
        from dramatiq.brokers.rabbitmq import RabbitmqBroker
    except ImportError:  # pragma: no cover - pika is a dependency
        return
    if isinstance(broker, RabbitmqBroker):
        broker.connection.process_data_events(0)


def broker_identity(broker: Broker) -> str | None:
    """Which run of the broker answers: a Redis server's ``run_id``, new at each start. None
    for any other broker (RabbitMQ keeps Dramatiq's durable queues and persistent messages
    across a restart). Blocking."""
    if isinstance(broker, RedisBroker):
        return redis_run_id(broker.client)
    return None


def redis_run_id(client: Any) -> str | None:
    """A Redis server's ``run_id`` (``INFO server``), through a blocking client."""
    run_id = client.info("server").get("run_id")
    return str(run_id) if run_id else None


class OffLoop:
    """Runs blocking broker calls on threads, each bounded by ``timeout`` seconds."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._threads = ThreadPoolExecutor(PUSH_THREADS, thread_name_prefix="outbox-push")

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on a thread; ``PushTimeout`` after ``timeout`` (the thread may still
        finish the call later: a late push is harmless, as release_claims made its epoch's
        action no longer EXECUTING, and a worker drops such a delivery)."""
        future = asyncio.get_running_loop().run_in_executor(self._threads, fn, *args)
        try:
            return await asyncio.wait_for(future, self.timeout)
        except TimeoutError:
            raise PushTimeout(f"no answer from the broker within {self.timeout}s") from None

    def close(self) -> None:
        self._threads.shutdown(wait=False, cancel_futures=True)


class BrokerGate:
    """Open while the broker answers; closed after a failed push until a check succeeds.

    ``check`` is the fabric's ``check_broker``: blocking, it raises unless the broker answers.
    """

    def __init__(self, check: Callable[[], None], off_loop: OffLoop) -> None:
        self.check_broker = check
        self.off_loop = off_loop
        self.open = True
        self._failures = 0
        self._next_check = 0.0
        self._closed_at = 0.0

    def close(self, reason: str) -> None:
        """After a failed push: no claims until the broker answers a check."""
        if self.open:
            self._closed_at = time.monotonic()
            log.warning("broker unreachable (%s); not claiming until it answers", reason)
        self.open = False
        self._schedule()

    def _schedule(self) -> None:
        self._next_check = time.monotonic() + backoff(self._failures)
        self._failures += 1

    async def check(self) -> str | None:
        """None when the broker answered; else why not, in one line."""
        try:
            await self.off_loop.run(self.check_broker)
        except Exception as error:
            return one_line(error)
        return None

    async def ready(self) -> bool:
        """Whether to claim now: open, or closed and a due check found the broker answering."""
        if self.open:
            return True
        if time.monotonic() < self._next_check:
            return False
        problem = await self.check()
        if problem is not None:
            self._schedule()
            log.warning(
                "broker still unreachable (%s); next check in %ss",
                problem,
                round(self._next_check - time.monotonic(), 2),
            )
            return False
        log.info(
            "broker answers again after %.1fs; claiming again", time.monotonic() - self._closed_at
        )
        self.open = True
        self._failures = 0
        return True

    async def wait_until_up(self, stop: asyncio.Event) -> bool:
        """At start: until the broker answers (True) or ``stop`` is set (False); each failed
        check is logged in one line with the next wait."""
        attempt = 0
        while not stop.is_set():
            checking = asyncio.ensure_future(self.check())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait([checking, stopped], return_when=asyncio.FIRST_COMPLETED)
            stopped.cancel()
            if not checking.done():
                checking.cancel()
                break
            problem = checking.result()
            if problem is None:
                if attempt:
                    log.info("broker reachable after %s failed checks", attempt)
                return True
            wait = backoff(attempt)
            attempt += 1
            log.warning(
                "broker unreachable (check %s: %s); trying again in %ss", attempt, problem, wait
            )
            if not await sleep_unless_stopped(wait, stop):
                break
        return False
