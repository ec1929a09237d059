"""Real processes for the broker scenarios: the outbox's claimer and workers, or a plain Dramatiq
worker pool, on Redis DB 14 (this run's keys and queues only) and the scenario's own schema.

Every pool runs with the same worker layout, so the outbox and its ceiling differ only by what
the outbox itself does; each keeps the Dramatiq ``worker_timeout`` it needs for its latency
(``WORKER_TIMEOUT_MS``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import redis

from benchmarks.common import DATABASE_URL, REDIS_URL, RUN_ID, noop_kind
from benchmarks.cpu import RABBITMQ_SERVICES, SERVICES
from outbox.dispatch.processes import (
    WORKER_READY,
    OutboxProcess,
    start_celery_worker,
    start_claimer,
    start_worker,
)

REPO = str(Path(__file__).resolve().parent.parent)
APP = "benchmarks.apps:outbox_app"
RAW_APP = "benchmarks.apps:raw_broker"
RAW_CELERY_APP = "benchmarks.celery_apps:raw"

#: Worker processes and threads of every pool: one process a core on this 2-core machine, and
#: threads enough that an I/O-bound actor (each outbox attempt waits on three short statements)
#: keeps the cores busy.
PROCESSES = 2
THREADS = 32
#: Actions a message carries (the outbox's default): a thread runs a message's actions together.
ACTIONS_PER_MESSAGE = 8
#: The claimer's in-flight bound: what the pool runs at once (threads x actions a message), so
#: the bound never idles a thread that could run. A bound of only what the threads hold left the
#: pool waiting for the claimer's next look (BUSY_POLL) once it had run its 128.
IN_FLIGHT = PROCESSES * THREADS * ACTIONS_PER_MESSAGE
#: The raw pool's ``worker_timeout``: its idle Redis consumer polls with a backoff up to this
#: many ms (Dramatiq's default is 1,000, which alone would put an idle pool's p50 latency in the
#: hundreds of ms); the price is half a core while idle, as each of its 64 worker threads also
#: wakes this often. The outbox's pools keep Dramatiq's default: the claimer wakes their idle
#: consumers with each push (``outbox.dispatch.wake``), so they need no short poll.
WORKER_TIMEOUT_MS = 10
#: Seconds a freshly started pool is left alone before a latency scenario starts timing.
IDLE_SETTLE = 0.5


@dataclass
class Rig:
    """One scenario's environment and the processes it started (stopped on exit)."""

    schema: str
    settings: dict[str, str] = field(default_factory=dict)
    stack: ExitStack = field(default_factory=ExitStack)

    def env(self) -> dict[str, str]:
        return {
            "OUTBOX_DATABASE_URL": DATABASE_URL,
            "OUTBOX_SCHEMA": self.schema,
            "OUTBOX_BROKER_URL": REDIS_URL,
            "PYTHONPATH": REPO,
            "OUTBOX_IN_FLIGHT": str(IN_FLIGHT),
            "OUTBOX_ACTIONS_PER_MESSAGE": str(ACTIONS_PER_MESSAGE),
            "OUTBOX_BENCH_RUN_ID": RUN_ID,
            **self.settings,
        }

    def _keep(self, proc: OutboxProcess) -> OutboxProcess:
        self.stack.callback(proc.close)
        return proc

    def outbox_workers(
        self, processes: int = PROCESSES, threads: int = THREADS, *, wait: bool = True
    ) -> OutboxProcess:
        """An ``outbox worker`` pool, of the common layout unless a scenario sizes its own;
        without ``wait``, returned as soon as it was started (not once it is ready)."""
        return self._keep(
            start_worker(APP, self.env(), processes=processes, threads=threads, cwd=REPO, wait=wait)
        )

    def outbox_celery_workers(self, queue: str) -> list[int]:
        """The Celery fabric's pool: ``PROCESSES`` Celery workers of ``THREADS`` threads (a
        Celery worker runs one pool kind, so the layout is the Dramatiq pool's). Their pids."""
        env = {**self.env(), "OUTBOX_APP": APP}
        return [
            self._keep(start_celery_worker(env, queues=[queue], concurrency=THREADS, cwd=REPO)).pid
            for _ in range(PROCESSES)
        ]

    def raw_celery_workers(self, queue: str) -> list[int]:
        """``celery-raw``'s pool: the same layout, the raw task only."""
        return [
            self._keep(
                start_celery_worker(
                    self.env(),
                    celery_app=RAW_CELERY_APP,
                    queues=[queue],
                    concurrency=THREADS,
                    cwd=REPO,
                )
            ).pid
            for _ in range(PROCESSES)
        ]

    def claimer(self, *, wait: bool = True) -> OutboxProcess:
        return self._keep(start_claimer(APP, self.env(), cwd=REPO, wait=wait))

    def idle_outbox(self) -> dict[str, int]:
        """Outbox workers and a claimer, then a pause so that the pool is idle when the
        scenario's first action arrives (the latency scenarios time single actions). Their
        pids by name, for a ``CpuMeter``."""
        workers = self.outbox_workers()
        claimer = self.claimer()
        time.sleep(IDLE_SETTLE)
        return {"claimer": claimer.pid, "workers": workers.pid}

    def raw_workers(self, *, wait: bool = True) -> OutboxProcess:
        argv = [sys.executable, "-m", "dramatiq", RAW_APP]
        argv += ["--processes", str(PROCESSES), "--threads", str(THREADS)]
        env = {"dramatiq_worker_timeout": str(WORKER_TIMEOUT_MS), **self.env()}
        proc = self._keep(OutboxProcess(argv, env, cwd=REPO))
        if wait:
            proc.wait_for(WORKER_READY, timeout=60.0, count=PROCESSES)
        return proc


def forget_run_keys() -> None:
    """Deletes this run's Redis keys: its queues (named after its kind) and its records."""
    with redis.Redis.from_url(REDIS_URL) as client:
        for key in client.scan_iter(match=f"*{RUN_ID}*", count=1000):
            client.delete(key)


def run_queues(run_id: str = RUN_ID) -> list[str]:
    """The RabbitMQ queues a run declares: the raw actor's and the no-op kind's, each with the
    delay and dead-letter queues Dramatiq declares beside it."""
    from dramatiq.common import dq_name, xq_name

    from benchmarks.apps import raw_queue

    queues = (raw_queue(run_id), noop_kind(run_id).queue_name)
    return [name for q in queues for name in (q, dq_name(q), xq_name(q))]


def forget_run_queues(amqp_url: str) -> None:
    """Deletes this run's RabbitMQ queues (deleting one that does not exist is no error)."""
    import pika

    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        channel = connection.channel()
        for name in run_queues():
            channel.queue_delete(name)
    finally:
        connection.close()


def _is_amqp(url: str) -> bool:
    return url.startswith(("amqp://", "amqps://"))


def broker_settings(broker_url: str) -> dict[str, str]:
    """A rig's settings for its pools to use ``broker_url`` (none for the benchmarks' Redis)."""
    return {} if broker_url == REDIS_URL else {"OUTBOX_BROKER_URL": broker_url}


def services_for(broker_url: str) -> dict[str, str]:
    """The services whose CPU a scenario on ``broker_url`` counts: RabbitMQ's too on it."""
    return RABBITMQ_SERVICES if _is_amqp(broker_url) else SERVICES


@contextmanager
def rig(schema: str, **settings: str) -> Iterator[Rig]:
    """Yields a ``Rig`` on clean queues; stops its processes and deletes this run's keys (and,
    on RabbitMQ, ``OUTBOX_BROKER_URL`` in ``settings``, its queues)."""
    broker_url = settings.get("OUTBOX_BROKER_URL", REDIS_URL)
    forget_run_keys()
    if _is_amqp(broker_url):
        forget_run_queues(broker_url)
    try:
        with ExitStack() as stack:
            yield Rig(schema, settings, stack)
    finally:
        forget_run_keys()
        if _is_amqp(broker_url):
            forget_run_queues(broker_url)


def wait_until(check, timeout: float, what: str, interval: float = 0.005) -> float:
    """Polls ``check()`` until true; returns ``time.perf_counter()`` when it was first seen."""
    deadline = time.monotonic() + timeout
    while True:
        if check():
            return time.perf_counter()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} after {timeout}s")
        time.sleep(interval)


def paced(n: int, per_second: float) -> Iterator[int]:
    """0..n-1, the i-th at ``start + i / per_second`` (never bunching up after a slow step)."""
    start = time.perf_counter()
    for i in range(n):
        delay = start + i / per_second - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        yield i
