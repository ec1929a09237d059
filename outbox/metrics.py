"""Prometheus metrics of the outbox, and the HTTP endpoint that serves them.

The two counters' names and labels are part of the contract. The gauges describe the backlog;
they come from the database (``outbox.backlog``) and are refreshed by the claimer on its
housekeeping timer (``outbox.maintenance.gauges``), so every process reports the same numbers and
a multiprocess scrape shows the most recent ones.

Multiprocess mode (as Dramatiq's Prometheus middleware uses it): set ``PROMETHEUS_MULTIPROC_DIR``
(and ``dramatiq_prom_db`` to the same directory) in the environment of every process before it
starts; each process then writes its samples there, and any one endpoint serving that directory
(``start_metrics_server`` in the claimer, or Dramatiq's own on 9191) shows them all.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIServer

from dramatiq.middleware import Middleware
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client import multiprocess as _multiprocess

from outbox.backlog import Backlog
from outbox.config import Settings
from outbox.fence_token import FenceToken
from outbox.observers import ExecutorObserver
from outbox.results import result_name
from outbox.state import ActionState, StopReason

if TYPE_CHECKING:
    from outbox.executor import Outcome
    from outbox.limits_view import LimitsView

log = logging.getLogger("outbox.metrics")

ATTEMPTS = Counter(
    "outbox_action_attempts",
    "Attempts by kind, result (done, retry, defer, uncertain, failed, cancelled, abandoned) and "
    "whether the fenced finish was recorded",
    ["kind", "result", "recorded"],
)
ENDED = Counter(
    "outbox_action_ended",
    "Actions that ended, by kind, final state and stop reason",
    ["kind", "state", "reason"],
)
HANDED_ON = Counter(
    "outbox_lane_hand_offs",
    "Actions a worker claimed and ran itself in the finish of their lane's previous action (the "
    "lane hand-off), not through the claimer, by kind",
    ["kind"],
)

GIVEN_BACK = Counter(
    "outbox_claims_given_back",
    "Claims a claimer gave back unrun, due again at once, by why: their push failed "
    "(push_failed), the broker that held their messages restarted (broker_restarted), the "
    "claimer that made them was killed before its push (claimer_lost), or the worker that took "
    "them was killed before their fence (worker_lost)",
    ["reason"],
)

MALFORMED = Counter(
    "outbox_malformed_messages",
    "Messages on an outbox queue that were not (action_id, epoch) pairs, dropped, by kind",
    ["kind"],
)

#: The ``reason`` label of an end whose reason is not admitted as a label value.
OTHER_REASON = "OTHER"
#: Most distinct adapter-given reasons a process admits as label values; later ones count as
#: ``OTHER``. The outbox's own stop reasons are always admitted and not counted against it.
MAX_ADAPTER_REASONS = 50
#: What an adapter-given reason must look like to be a label value: a short code
#: (``SMTP_RCPT_550``), never free text (an error message, an address, an id).
REASON_LABEL = re.compile(r"^[A-Z][A-Z0-9_]{0,47}$")
_OUTBOX_REASONS = frozenset(
    value for name, value in vars(StopReason).items() if name.isupper() and isinstance(value, str)
)
_adapter_reasons: set[str] = set()
_reasons_lock = threading.Lock()


def reason_label(reason: str) -> str:
    """The ``reason`` label value of an end: the outbox's stop reasons as they are; an adapter's
    reason as it is when it is a short code and one of the first ``MAX_ADAPTER_REASONS``
    distinct ones, else ``OTHER``. Adapters give reasons freely; a label must stay a small set
    (each value is a time series kept for ever). The database keeps the exact reason."""
    if reason in _OUTBOX_REASONS or reason in _adapter_reasons:
        return reason
    if not REASON_LABEL.match(reason):
        return OTHER_REASON
    with _reasons_lock:
        if reason in _adapter_reasons:
            return reason
        if len(_adapter_reasons) >= MAX_ADAPTER_REASONS:
            return OTHER_REASON
        _adapter_reasons.add(reason)
        return reason


# Label children by their values: ``.labels()`` validates and locks on every call, and each
# attempt counts once or twice. A handful of kinds x results x states keeps these small.
_attempt_children: dict[tuple[str, str, bool], Any] = {}
_ended_children: dict[tuple[str, str, str], Any] = {}


def record_malformed_message(kind: str) -> None:
    MALFORMED.labels(kind=kind).inc()


def record_attempt(kind: str, result: str, recorded: bool) -> None:
    key = (kind, result, recorded)
    child = _attempt_children.get(key)
    if child is None:
        child = ATTEMPTS.labels(kind=kind, result=result, recorded=str(recorded).lower())
        _attempt_children[key] = child
    child.inc()


def record_ended(kind: str, state: str, reason: str) -> None:
    """Counts an end. ``kind`` and ``state`` are bounded (declared kinds, the state enum);
    ``reason`` goes through ``reason_label``."""
    key = (kind, state, reason)
    child = _ended_children.get(key)
    if child is None:
        label = reason_label(reason)
        child = _ended_children.get((kind, state, label))
        if child is None:
            child = ENDED.labels(kind=kind, state=state, reason=label)
            _ended_children[(kind, state, label)] = child
        if label == reason:
            _ended_children[key] = child
    child.inc()


class MetricsObserver(ExecutorObserver):
    """The executor's counters: every attempt (``outbox_action_attempts_total``), a refused take
    as an ``abandoned`` attempt, every end (``outbox_action_ended_total``), and every lane
    hand-off (``outbox_lane_hand_offs_total``)."""

    def on_attempt(self, outcome: Outcome) -> None:
        record_attempt(outcome.kind, result_name(outcome.result), outcome.recorded)
        if outcome.next is not None:
            HANDED_ON.labels(kind=outcome.kind).inc()

    def on_ended(self, action_id: int, kind: str, state: ActionState, reason: str) -> None:
        record_ended(kind, state.value, reason)

    def on_take_refused(self, kind: str, token: FenceToken) -> None:
        record_attempt(kind, "abandoned", False)


# Gauges read the database, not this process: in multiprocess mode the most recent value of a
# live process is the truth ("livemostrecent"); a dead claimer's stale value is dropped.
DUE = Gauge(
    "outbox_actions_due",
    "Admitted actions that are due and not expired, by kind",
    ["kind"],
    multiprocess_mode="livemostrecent",
)
OLDEST_DUE_AGE = Gauge(
    "outbox_oldest_due_age_seconds",
    "How long the oldest due action of a kind has been due, by the database clock",
    ["kind"],
    multiprocess_mode="livemostrecent",
)
IN_FLIGHT = Gauge(
    "outbox_actions_in_flight",
    "Actions claimed and not yet finished (lease still running), by kind and Dramatiq queue",
    ["kind", "queue"],
    multiprocess_mode="livemostrecent",
)
UNCONSUMED = Gauge(
    "outbox_claims_unconsumed",
    "Claims whose lease ran out before any worker took their message, by kind: above 0, the "
    "worker pool is down or lost messages, and claimers claim nothing new of that kind",
    ["kind"],
    multiprocess_mode="livemostrecent",
)
IN_FLIGHT_BOUND = Gauge(
    "outbox_claimer_in_flight_bound",
    "How many claims of a kind this claimer keeps in flight at most after its workers fell a "
    "lease behind (halved then, grown back to OUTBOX_IN_FLIGHT while they keep up)",
    ["kind"],
    multiprocess_mode="livemin",
)
CLAIMING_STALLED = Gauge(
    "outbox_claimer_stalled",
    "1 while this claimer claims nothing new of a kind because no worker took its claims "
    "within their lease (it pushes one probe at a time), else 0",
    ["kind"],
    multiprocess_mode="livemax",
)
BLOCKED_LANES = Gauge(
    "outbox_lanes_blocked",
    "Lanes whose head waits for a retry while later actions wait behind it, by the head's kind",
    ["kind"],
    multiprocess_mode="livemostrecent",
)
PROVIDER_RETRYING = Gauge(
    "outbox_provider_retrying_actions",
    "Distinct actions of a kind whose attempts answered Retry since the kind's last DONE (up "
    "to 16); at OUTBOX_OUTAGE_THRESHOLD or more the provider counts as down and exhausting "
    "retries give their attempt back",
    ["kind"],
    multiprocess_mode="livemostrecent",
)
PROVIDER_RETRYING_FOR = Gauge(
    "outbox_provider_retrying_seconds",
    "Seconds since the first of those actions answered Retry (0 when none did since the kind's "
    "last DONE)",
    ["kind"],
    multiprocess_mode="livemostrecent",
)
PROVIDER_HELD_FOR = Gauge(
    "outbox_provider_held_seconds",
    "Seconds until claims take a kind again while its provider's outage holds it (0 when not held)",
    ["kind"],
    multiprocess_mode="livemostrecent",
)


VACUUM_HORIZON_HELD = Gauge(
    "outbox_vacuum_horizon_held_seconds",
    "How long the longest open transaction or prepared transaction of the database has held "
    "vacuum back (0: none open); while it is held, every claim steps over the dead rows left "
    "since, and claims slow down",
    multiprocess_mode="livemostrecent",
)
VACUUM_HORIZON_HELD_XIDS = Gauge(
    "outbox_vacuum_horizon_held_xids",
    "How many transactions back the oldest holder of the database's vacuum horizon holds it: "
    "an open transaction, a prepared transaction, a replication slot or a replica's feedback "
    "(0: none); the dead rows of every write since are kept",
    multiprocess_mode="livemostrecent",
)


EVENT_LOOP_LAG = Gauge(
    "outbox_event_loop_lag_seconds",
    "How late this process's event loop ran its timers at worst over the last 15 s, by role "
    "(claimer, worker): an attempt is cut this late past its lease (outbox.loop_lag)",
    ["role"],
    multiprocess_mode="livemax",
)


WAITING = Gauge(
    "outbox_actions_waiting",
    "Admitted actions not yet due (scheduled by not_before, backing off, deferred), by kind",
    ["kind"],
    multiprocess_mode="livemostrecent",
)
RATE_LIMITED = Gauge(
    "outbox_actions_rate_limited",
    "Admitted actions deferred by a rate limit (their slot was too far away), by kind",
    ["kind"],
    multiprocess_mode="livemostrecent",
)
RATE_NEXT_SLOT = Gauge(
    "outbox_rate_next_slot_seconds",
    "Seconds until a rate-limited kind's next free slot (0: free now), by kind",
    ["kind"],
    multiprocess_mode="livemostrecent",
)
RATE_HELD = Gauge(
    "outbox_rate_held_seconds",
    "Seconds a provider's pause (429, Retry-After) still holds a rate-limited kind, by kind",
    ["kind"],
    multiprocess_mode="livemostrecent",
)


def set_limit_gauges(view: LimitsView) -> None:
    """The waits the limits cause, from ``outbox.limits_view`` (zeros included)."""
    for item in view.kinds.values():
        WAITING.labels(kind=item.kind).set(item.waiting)
        RATE_LIMITED.labels(kind=item.kind).set(item.rate_limited)
    for bucket in view.buckets:
        if not bucket["limit_key"]:  # the kind's own bucket (a key's would explode the labels)
            RATE_NEXT_SLOT.labels(kind=bucket["kind"]).set(bucket["next_slot_in"])
            RATE_HELD.labels(kind=bucket["kind"]).set(bucket["held_for"])


def set_vacuum_horizon_gauges(holders: list[dict[str, Any]]) -> None:
    """The longest hold of ``holders`` (``outbox.vacuum_horizon``; slots and replicas carry no
    time) and the most transactions any of them holds the horizon back (0 when there is none)."""
    timed = (holder["held_s"] for holder in holders if holder["held_s"] is not None)
    VACUUM_HORIZON_HELD.set(max(timed, default=0.0))
    VACUUM_HORIZON_HELD_XIDS.set(max((holder["xid_age"] for holder in holders), default=0))


def set_backlog_gauges(backlog: Backlog) -> None:
    """Sets every gauge for every kind in ``backlog`` (zeros included, so a drained backlog
    reads 0 rather than its last non-zero value)."""
    for item in backlog.kinds.values():
        DUE.labels(kind=item.kind).set(item.due)
        OLDEST_DUE_AGE.labels(kind=item.kind).set(item.oldest_due_age)
        IN_FLIGHT.labels(kind=item.kind, queue=item.queue).set(item.in_flight)
        BLOCKED_LANES.labels(kind=item.kind).set(item.blocked_lanes)
        UNCONSUMED.labels(kind=item.kind).set(item.unconsumed)
        PROVIDER_RETRYING.labels(kind=item.kind).set(item.retrying)
        PROVIDER_RETRYING_FOR.labels(kind=item.kind).set(item.retrying_for)
        PROVIDER_HELD_FOR.labels(kind=item.kind).set(item.held_for)


def record_given_back(reason: str, claims: int) -> None:
    if claims:
        GIVEN_BACK.labels(reason=reason).inc(claims)


def set_claiming_stalled(kind: str, stalled: bool) -> None:
    CLAIMING_STALLED.labels(kind=kind).set(1 if stalled else 0)


def set_in_flight_bound(kind: str, bound: int) -> None:
    IN_FLIGHT_BOUND.labels(kind=kind).set(bound)


def multiprocess_dir() -> str | None:
    """The multiprocess directory, when this process runs in prometheus_client's multiprocess
    mode (the variable must be set before prometheus_client is first imported)."""
    # prometheus_client still honours the old lower-case name; so does Dramatiq.
    legacy = "prometheus_multiproc_dir"
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or os.environ.get(legacy)


def metrics_registry() -> CollectorRegistry:
    """What an endpoint serves: every process's samples in multiprocess mode, else this one's."""
    path = multiprocess_dir()
    if path is None:
        return REGISTRY
    registry = CollectorRegistry()
    _multiprocess.MultiProcessCollector(registry, path=path)
    return registry


def start_metrics_server(port: int, addr: str | None = None) -> WSGIServer:
    """Serves ``/metrics`` on ``addr:port`` from a daemon thread and returns the server
    (``server.server_port`` is the bound port when ``port`` is 0; ``server.shutdown()`` stops it).
    ``addr`` defaults to ``$OUTBOX_METRICS_HOST``, else 127.0.0.1 (loopback only)."""
    if addr is None:
        addr = Settings.from_env().metrics_host
    server, _thread = start_http_server(port, addr=addr, registry=metrics_registry())
    log.info(
        "serving metrics on %s:%d",
        addr,
        server.server_port,
        extra={"event": "metrics_server", "port": server.server_port},
    )
    return server


def mark_process_dead(pid: int | None = None) -> None:
    """In multiprocess mode, drops a process's live gauges when it exits (call at shutdown)."""
    path = multiprocess_dir()
    if path is not None:
        _multiprocess.mark_process_dead(os.getpid() if pid is None else pid, path)


def prepare_multiprocess_env(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """Makes the processes started with ``environ`` share one multiprocess directory: the one it
    names, else a fresh one. Dramatiq's Prometheus middleware is pointed at the same directory
    (``dramatiq_prom_db``), so either endpoint shows both. Call it before starting them."""
    path = environ.get("PROMETHEUS_MULTIPROC_DIR") or environ.get("prometheus_multiproc_dir")
    if not path:
        path = tempfile.mkdtemp(prefix="outbox-prometheus-")
        environ["PROMETHEUS_MULTIPROC_DIR"] = path
    environ.setdefault("dramatiq_prom_db", path)
    return path


def serve_metrics_fork() -> int:
    """A Dramatiq fork function: serves every worker process's metrics on
    ``$OUTBOX_METRICS_PORT`` until Dramatiq stops the fork. ``MetricsExposition`` adds it;
    by hand: ``dramatiq ... --fork-function outbox.metrics:serve_metrics_fork``."""
    settings = Settings.from_env()
    if not settings.metrics_port:
        return 0
    start_metrics_server(settings.metrics_port, settings.metrics_host)
    while True:  # the server thread serves; Dramatiq's SIGTERM handler ends this process
        time.sleep(3600)


class MetricsExposition(Middleware):
    """Makes a ``dramatiq`` worker command fork one process that serves the metrics of all its
    worker processes (they share the multiprocess directory)."""

    @property
    def forks(self) -> list:
        # A module of its own, whose import applies the log format in the fork process.
        from outbox.dispatch.metrics_fork import serve_metrics

        return [serve_metrics]
