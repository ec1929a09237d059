"""The Celery fabric: one Celery task per kind, joined to a Celery app by ``install``.

Each task takes the same message as the Dramatiq actor, ``(action_id, epoch)`` pairs flattened
(``FenceToken.to_args``), and hands it to ``deliver`` and the process's ``WorkerRuntime``:
the take once per epoch, the executor and the group commit are the Dramatiq path's own code.

How Celery's delivery semantics meet the outbox's epochs (the task options ``install`` sets):

- ``acks_late`` and ``reject_on_worker_lost``: a message is acknowledged after its task ran,
  and a worker process that died (SIGKILL, OOM, a hard time limit) hands its message back to
  the queue. Its redelivery is harmless: if the first delivery took the epoch, the take refuses
  the second (dropped, logged as abandoned); if it died before the take, the redelivery runs
  it. An action is reclaimed under a new epoch only when its lease runs out, never because of
  a redelivery.
- Redis's visibility timeout (a message unacknowledged that long is delivered again) and a
  RabbitMQ consumer's lost channel are redeliveries of the same kind: duplicates, dropped.
- No Celery retries (``max_retries=0``; the outbox owns retries), no result (``ignore_result``;
  no result backend is needed), JSON (``serializer``), each kind on its own queue
  (``ActionKind.queue_name``, given to every publish).
- ``soft_time_limit`` = the lease and ``TIME_LIMIT_GRACE``: ``SoftTimeLimitExceeded`` cancels
  an attempt that outstayed its lease (the executor ends each attempt at its lease itself, its
  finish written; the grace keeps a late loop's attempts from being cut off past their fence
  while their lease holds, as for Dramatiq's time limit); ``time_limit`` a little later ends the
  process of one that did not cancel.

A worker process's event loop and pool (and its heartbeat) start once it consumes an outbox
queue: in each prefork child after its fork (``worker_process_init``), in the worker's own
process for a thread pool (``worker_ready``), else on a process's first message; a prefork
parent never opens one its children would inherit (``WorkerRuntime`` checks the pid). They
close when the process (``worker_process_shutdown``) or the worker (``worker_shutdown``) stops. With
``OUTBOX_METRICS_PORT`` the worker's main process serves the outbox's metrics once it is ready
(``worker_ready``), every prefork child's included when ``PROMETHEUS_MULTIPROC_DIR`` is set
(``outbox worker --fabric celery`` sets it).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery import Celery, Task, signals
from celery.utils.imports import symbol_by_name

from outbox import metrics
from outbox.dispatch.broker import (
    DEFAULT_BROKER_URL,
    REDIS_CONNECT_TIMEOUT,
    REDIS_SOCKET_TIMEOUT,
)
from outbox.dispatch.celery_health import ConsumerHealth
from outbox.dispatch.fabric import Batch, batches, deliver
from outbox.dispatch.pushing import redis_run_id
from outbox.dispatch.runtime import TIME_LIMIT_GRACE, WorkerRuntime
from outbox.errors import ConfigurationError
from outbox.fence_token import FenceToken

if TYPE_CHECKING:
    from outbox.config import Settings
    from outbox.outbox import Outbox

#: Celery task names: one per kind, e.g. ``outbox_email`` (as the Dramatiq actors').
TASK_PREFIX = "outbox_"
#: Messages a worker slot prefetches (``outbox_app`` says why not Celery's default of 4).
PREFETCH_MULTIPLIER = 1
#: How long after the soft time limit (the lease and its grace) Celery ends a task's process.
HARD_LIMIT_GRACE = 30

__all__ = ["TASK_PREFIX", "CeleryDispatch", "app_from_settings", "install", "installed"]


@dataclass
class CeleryDispatch:
    """What ``install`` joined to a Celery app: its tasks (by kind name) and the worker runtime.
    The Celery ``Fabric`` (``outbox.dispatch.fabric``)."""

    outbox: Outbox
    app: Celery
    runtime: WorkerRuntime
    tasks: dict[str, Task] = field(default_factory=dict)

    @property
    def kinds(self) -> list[str]:
        return sorted(self.tasks)

    @property
    def queues(self) -> list[str]:
        return sorted(self.outbox.kinds[kind].queue_name for kind in self.tasks)

    def push_batch(self, kind: str, tokens: Sequence[FenceToken]) -> None:
        """Puts one message of ``tokens`` on the kind's queue."""
        self._publish([(kind, list(tokens))])

    def push(self, kind: str, token: FenceToken) -> None:
        """Puts one ``(action_id, epoch)`` message on the kind's queue."""
        self._publish([(kind, [token])])

    def loop_push(self) -> None:
        """None: kombu's publish is blocking, so the claimer pushes from a thread."""
        return None

    def push_many(self, items: Iterable[tuple[str, FenceToken]]) -> int:
        """Pushes ``(kind, token)`` items, at most ``actions_per_message`` a message, over one
        producer (one broker connection for the round). Returns how many messages went."""
        messages = batches(items, self.outbox.settings.actions_per_message)
        self._publish(messages)
        return len(messages)

    def _publish(self, messages: Sequence[Batch]) -> None:
        """Publishes over one pooled producer. Fails at once when the broker does not answer:
        the connection is tried once (kombu would retry a connect up to
        ``broker_connection_max_retries`` times, seconds apart) and Celery's own publish
        retries are off (``retry=False``), so the claimer gives the claims back at once."""
        with self.app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=0)
            for kind, tokens in messages:
                self.tasks[kind].apply_async(
                    args=FenceToken.to_args(tokens),
                    queue=self.outbox.kinds[kind].queue_name,
                    retry=False,
                    producer=producer,
                )

    def check_broker(self) -> None:
        """Raises unless the broker answers: a fresh connection (one attempt, no retries) and,
        on Redis, a PING (kombu connects to Redis lazily)."""
        with self.app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=0)
            if conn.transport.driver_type == "redis":
                conn.default_channel.client.ping()

    def broker_identity(self) -> str | None:
        """A Redis transport's ``run_id``, over a pooled connection (the claimer asks every
        second); None on RabbitMQ (durable queues, persistent messages) and any other
        transport, known without connecting."""
        with self.app.connection_for_write() as unconnected:
            if unconnected.transport.driver_type != "redis":
                return None
        with self.app.pool.acquire(block=True) as conn:
            conn.ensure_connection(max_retries=0)
            return redis_run_id(conn.default_channel.client)


def app_from_settings(settings: Settings) -> Celery:
    """The Celery app of ``OUTBOX_CELERY_APP`` (``module:attribute``, the shop's own), else one
    built for the outbox on ``OUTBOX_BROKER_URL`` (else local Redis)."""
    if settings.celery_app:
        try:
            app = symbol_by_name(settings.celery_app)
        except (ImportError, AttributeError, ValueError) as error:
            raise ConfigurationError(
                f"OUTBOX_CELERY_APP: cannot import {settings.celery_app!r} ({error})"
            ) from None
        if not isinstance(app, Celery):
            raise ConfigurationError(
                f"OUTBOX_CELERY_APP: {settings.celery_app!r} is a {type(app).__name__}, "
                "not a celery.Celery"
            )
        return app
    return outbox_app(settings.broker_url or DEFAULT_BROKER_URL)


def outbox_app(broker_url: str) -> Celery:
    """A Celery app for the outbox alone, with the settings a shop's app should have too
    (docs/celery.md): no result backend, JSON only, late acks, publisher confirms on RabbitMQ,
    bounded Redis sockets, and one message prefetched a slot: a message held by a busy worker
    waits there with its lease running while another worker may idle (a prefork worker of two
    processes at Celery's default of 4 holds eight); the in-flight bound keeps the backlog in
    PostgreSQL instead."""
    app = Celery("outbox", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
        result_backend=None,
        worker_prefetch_multiplier=PREFETCH_MULTIPLIER,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        broker_connection_retry_on_startup=True,
        broker_transport_options={
            "confirm_publish": True,
            "socket_connect_timeout": REDIS_CONNECT_TIMEOUT,
            "socket_timeout": REDIS_SOCKET_TIMEOUT,
        },
    )
    return app


_installed: weakref.WeakKeyDictionary[Outbox, CeleryDispatch] = weakref.WeakKeyDictionary()


def installed(outbox: Outbox) -> CeleryDispatch | None:
    """The ``CeleryDispatch`` that ``install`` made for ``outbox`` in this process, if any."""
    return _installed.get(outbox)


def task_options(outbox: Outbox) -> dict[str, Any]:
    """The options of every outbox task (the module's docstring says why each)."""
    soft = int((outbox.settings.lease + TIME_LIMIT_GRACE).total_seconds())
    return {
        "acks_late": True,
        "reject_on_worker_lost": True,
        "acks_on_failure_or_timeout": True,
        "ignore_result": True,
        "serializer": "json",
        "max_retries": 0,
        "soft_time_limit": soft,
        "time_limit": soft + HARD_LIMIT_GRACE,
        "typing": False,
    }


def _task_fn(runtime: WorkerRuntime, kind: str) -> Callable[..., None]:
    def run_action(*args: Any) -> None:
        # A malformed message returns (is dropped by name): Celery never retries it.
        deliver(runtime, kind, args)

    run_action.__name__ = f"{TASK_PREFIX}{kind.lower()}"
    run_action.__qualname__ = run_action.__name__
    return run_action


def install(
    outbox: Outbox, app: Celery | None = None, *, kinds: Iterable[str] | None = None
) -> CeleryDispatch:
    """Registers one task per kind with an adapter (or per name in ``kinds``) on ``app``:

        from outbox.celery import install
        install(outbox, app)    # in the module ``celery -A`` loads

    ``app`` defaults to ``app_from_settings`` (``OUTBOX_CELERY_APP``, else an app on
    ``OUTBOX_BROKER_URL``). Calling it again for the same outbox returns the first
    ``CeleryDispatch``. ``celery -A myapp worker -Q outbox.email`` then runs the kind's adapter.
    """
    known = _installed.get(outbox)
    if known is not None:
        if app is not None and app is not known.app:
            raise ValueError("this outbox is already installed on another Celery app")
        return known
    if app is None:
        app = app_from_settings(outbox.settings)
        # Importing the shop's app may have installed this outbox on it (its one line).
        known = _installed.get(outbox)
        if known is not None and known.app is app:
            return known
    runtime = WorkerRuntime(outbox)
    dispatch = CeleryDispatch(outbox, app, runtime)
    options = task_options(outbox)
    for name in sorted(kinds if kinds is not None else outbox.adapters):
        dispatch.tasks[name] = app.task(name=f"{TASK_PREFIX}{name.lower()}", **options)(
            _task_fn(runtime, name)
        )

    def stop_runtime(**_: Any) -> None:
        runtime.stop()  # a no-op in a process where it never started

    def shutting_down(**_: Any) -> None:
        # A warm shutdown waits for the running tasks: they hand no lane on meanwhile.
        runtime.stop_handing_off()

    def process_ended(**_: Any) -> None:
        runtime.stop()
        metrics.mark_process_dead()

    def consumes_outbox_queue() -> bool:
        # The worker's -Q selection (empty: every queue it knows); set before a prefork fork.
        selected = set(app.amqp.queues.consume_from or app.amqp.queues)
        return bool(selected & set(dispatch.queues))

    def start_in_child(**_: Any) -> None:
        # A prefork child, after the fork: its own loop and pool (and heartbeat) now, so an
        # idle worker is seen live, rather than on its first message.
        if consumes_outbox_queue():
            runtime.start()

    def worker_ready(sender: Any = None, **_: Any) -> None:
        # In the worker's main process once it consumes (never in a claimer that installed the
        # tasks): prefork children share ``PROMETHEUS_MULTIPROC_DIR`` when it is set.
        if outbox.settings.metrics_port:
            metrics.start_metrics_server(outbox.settings.metrics_port)
        pool = getattr(getattr(sender, "controller", None), "pool_cls", None)
        in_process = "prefork" not in str(getattr(pool, "__module__", pool)).lower()
        if in_process and consumes_outbox_queue():
            runtime.start()  # a thread or solo pool runs the tasks in this process

    # The worker's health file (``outbox health --role worker``), from its consumer.
    if ConsumerHealth not in app.steps["consumer"]:
        app.steps["consumer"].add(ConsumerHealth)
    # Celery's signals are process-wide: the handlers are kept (weak=False) for the app's life.
    signals.worker_process_shutdown.connect(process_ended, weak=False)
    signals.worker_shutdown.connect(stop_runtime, weak=False)
    signals.worker_shutting_down.connect(shutting_down, weak=False)
    signals.worker_process_init.connect(start_in_child, weak=False)
    signals.worker_ready.connect(worker_ready, weak=False)
    _installed[outbox] = dispatch
    return dispatch
