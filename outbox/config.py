"""Settings of an ``Outbox``: from the environment (prefix ``OUTBOX_``), overridable in code."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

from outbox.errors import ConfigurationError
from outbox.event_loop import loop_factory
from outbox.limits import parse_limits
from outbox.provider_outage import (
    DEFAULT_HOLD,
    DEFAULT_LIMIT,
    DEFAULT_THRESHOLD,
    MAX_THRESHOLD,
    OutageRule,
)
from outbox.queries import validate_schema
from outbox.request_checks import DEFAULT_MAX_PAYLOAD_BYTES

#: The prefix of every environment variable the outbox reads.
ENV_PREFIX = "OUTBOX_"
#: Broker URL schemes: Redis (the default broker) and RabbitMQ.
REDIS_SCHEMES = ("redis", "rediss", "unix")
RABBITMQ_SCHEMES = ("amqp", "amqps")
#: Dispatch fabrics (``fabric``): the claimer pushes onto one, ``outbox worker`` runs it.
FABRICS = ("dramatiq", "celery")


@dataclass(frozen=True, slots=True)
class Settings:
    """Every knob, with the default a production deployment starts from.

    Durations are given in seconds in the environment (``OUTBOX_LEASE_SECONDS=300``).
    """

    #: PostgreSQL URL (``OUTBOX_DATABASE_URL``, else ``DATABASE_URL``).
    database_url: str | None = None
    #: The PostgreSQL schema that holds the outbox's tables.
    schema: str = "outbox"
    #: Broker URL: redis://... (the default broker) or amqp://...
    broker_url: str | None = None
    #: The dispatch fabric the claimer pushes to and ``outbox worker`` runs: ``dramatiq`` or
    #: ``celery`` (docs/celery.md). Both carry the same messages with the same guarantees.
    fabric: str = "dramatiq"
    #: ``module:attribute`` of an existing Celery app the Celery fabric publishes through (its
    #: broker and transport options); unset, the outbox builds one on ``broker_url``.
    celery_app: str | None = None
    #: How long a claim owns an action. Long enough for the slowest provider call plus the queue
    #: wait the in-flight bound allows; a crash costs at most this much delay.
    lease: timedelta = timedelta(minutes=5)
    #: The fence refuses a write with less than this of the lease left: a provider call must
    #: finish within it, so no reclaim can start while it may still be running.
    write_margin: timedelta = timedelta(seconds=60)
    #: Most actions one claim statement takes.
    batch_size: int = 100
    #: Per kind (queue), most actions claimed and not yet finished: the worker pool's capacity.
    in_flight: int = 64
    #: Most ``(action_id, epoch)`` pairs one Dramatiq message carries. A claim round's actions
    #: of one kind share messages, which a worker runs concurrently on its event loop, so
    #: Dramatiq's own cost a message (consume, decode, ack) is paid once for several actions.
    #: 1 = one message an action.
    actions_per_message: int = 8
    #: A worker that ends a lane's action runs the lane's next one itself, claimed in the same
    #: statement as the end, when it is due and of the same kind and limit key (a swap: no
    #: bound of the claimer's moves), up to this many in a row from one message; past that,
    #: the claimer hands the lane on. 0 = every action goes through the claimer.
    hand_off: int = 10
    #: Retry backoff: base * 2^(attempt-1), capped, with jitter, unless the adapter gives a wait.
    retry_base: timedelta = timedelta(seconds=5)
    retry_cap: timedelta = timedelta(hours=1)
    #: A kind's provider counts as down once this many distinct actions' attempts answered
    #: ``Retry`` with no DONE of the kind between them; an attempt that would then end FAILED
    #: ATTEMPTS_EXHAUSTED gives its attempt back and waits instead (outbox/provider_outage.py).
    #: 2 to 16; 0 = never: every attempt counts, whatever the kind's other actions do.
    outage_threshold: int = DEFAULT_THRESHOLD
    #: How long after its first retry an outage keeps giving attempts back; past it, actions
    #: spend their attempts again and end FAILED as without an outage.
    outage_limit: timedelta = DEFAULT_LIMIT
    #: The first hold of a kind whose provider counts as down: claims skip the kind this long,
    #: then take its due actions again; each further hold of the same outage is twice the last,
    #: up to 12 times the first (outbox/provider_outage.py). 0 = no hold: the down provider is
    #: still called once an action a backoff.
    outage_hold: timedelta = DEFAULT_HOLD
    #: Ended actions are deleted this long after they ended.
    retention: timedelta = timedelta(days=30)
    #: The payload of an action that ended UNCERTAIN, FAILED or CANCELLED is kept this long for
    #: an operator's resend or retry (then dropped by maintenance; also once decided).
    parked_payload_retention: timedelta = timedelta(days=7)
    #: Each claimer and worker process records that it is alive this often.
    heartbeat_interval: timedelta = timedelta(seconds=5)
    #: Maintenance deletes the heartbeat row of a process silent for this long.
    process_stale_after: timedelta = timedelta(hours=1)
    #: The claimer polls this often when no NOTIFY wakes it.
    poll_interval: timedelta = timedelta(seconds=1)
    #: Housekeeping (lost leases, expiry, retention) runs this often in the claimer.
    housekeeping_interval: timedelta = timedelta(seconds=5)
    #: Longest a claim round waits for the claim lock another claimer holds; the round then
    #: gives up, logs the wait, and tries again.
    claim_lock_timeout: timedelta = timedelta(seconds=2)
    #: Longest a claim transaction may sit idle between its statements (a claimer paused, or cut
    #: off, while it holds the claim lock): the server then ends that claimer's session, which
    #: frees the lock and rolls its claim back.
    claim_idle_timeout: timedelta = timedelta(seconds=1)
    #: Longest one statement of a claim round may run.
    claim_statement_timeout: timedelta = timedelta(seconds=5)
    #: A push to the broker (and a broker check) that takes longer counts as failed: the
    #: claims it carried are given back at once, and the claimer claims nothing more until the
    #: broker answers again.
    push_timeout: timedelta = timedelta(seconds=5)
    #: Connections in each process's pool.
    pool_size: int = 10
    #: Port of the Prometheus endpoint (0 = none).
    metrics_port: int = 0
    #: Address the Prometheus endpoint listens on: loopback unless widened (``0.0.0.0`` for a
    #: scrape from another host or container).
    metrics_host: str = "127.0.0.1"
    #: Largest payload an enqueue accepts, in bytes of its compact UTF-8 JSON. A payload holds
    #: identifiers the adapter reads the rest by; a larger one is refused (InvalidActionRequest).
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES
    #: ``outbox prune`` and ``outbox erase`` ask before deleting more actions than this (on a
    #: terminal; elsewhere they need ``--yes``). 0: ask before deleting any.
    confirm_threshold: int = 1000
    #: Who may log in to the console (``outbox dashboard``): comma-separated ``name:password``
    #: pairs, a password in clear or as a werkzeug hash (``scrypt:...``). Without any, the
    #: console listens on loopback only and asks for no login. Never shown in a repr or a log.
    console_users: str | None = field(default=None, repr=False)
    #: Key that signs the console's session cookies; random for each process when unset (a
    #: restart then logs everyone out). Set it when several console processes share a host name.
    console_secret_key: str | None = field(default=None, repr=False)
    #: Directory where the claimer and each worker process keep a health file that
    #: ``outbox health`` reads (None = no files). docs/operations.md, "Health".
    health_dir: str | None = None
    #: Port of the ``/livez`` and ``/readyz`` endpoint of a claimer or worker pool (0 = none).
    health_port: int = 0
    #: Address the health endpoint listens on: loopback unless widened (``0.0.0.0`` for a
    #: probe from another host, e.g. a kubelet's httpGet).
    health_host: str = "127.0.0.1"
    #: A loop that went this long without a round is not live; one that went this long without
    #: doing its job (or had trouble since) is not ready.
    health_stale: timedelta = timedelta(seconds=60)
    #: Rate limits and concurrency caps per kind, over what the kinds declare (docs/limits.md):
    #: ``EMAIL: rate=14/s, key_concurrency=10; WEBHOOK: key_rate=100/m``. Every claimer and
    #: worker of a deployment must be given the same.
    limits: str = ""
    #: The event loop of the claimer and of each worker process's loop thread: ``auto`` (uvloop
    #: where it is installed, else asyncio's), ``uvloop`` or ``asyncio`` (outbox/event_loop.py).
    event_loop: str = "auto"

    def __post_init__(self) -> None:
        validate_schema(self.schema)
        loop_factory(self.event_loop)  # refuses an unknown loop, or uvloop where it is missing
        parse_limits(self.limits)  # refuses a malformed or hostile value before anything runs
        if self.fabric not in FABRICS:
            raise ConfigurationError(
                f"{env_name('fabric')} (--fabric): {self.fabric!r} is not one of "
                f"{', '.join(FABRICS)}"
            )
        if self.write_margin >= self.lease:
            raise ConfigurationError(
                f"write_margin ({self.write_margin}) must be shorter than the lease ({self.lease})"
            )
        for name in (
            "claim_lock_timeout",
            "claim_idle_timeout",
            "claim_statement_timeout",
            "push_timeout",
            "heartbeat_interval",
            "health_stale",
        ):
            if getattr(self, name) <= timedelta(0):
                raise ConfigurationError(f"{name} must be more than 0 seconds")
        for name in (
            "batch_size",
            "in_flight",
            "actions_per_message",
            "pool_size",
            "max_payload_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{env_name(name)}: must be >= 1")
        if self.outage_threshold != 0 and not 2 <= self.outage_threshold <= MAX_THRESHOLD:
            raise ConfigurationError(
                f"{env_name('outage_threshold')}: must be 0 (off) or 2 to {MAX_THRESHOLD}"
            )
        if self.outage_hold < timedelta(0):
            raise ConfigurationError(f"{env_name('outage_hold')}: must be >= 0")
        for name in ("confirm_threshold", "hand_off"):
            if getattr(self, name) < 0:
                raise ConfigurationError(f"{env_name(name)}: must be >= 0")
        for name in ("metrics_port", "health_port"):
            if not 0 <= getattr(self, name) <= 65535:
                raise ConfigurationError(f"{env_name(name)}: must be a port, 0 to 65535")
        if self.database_url is not None:
            _check_database_url(self.database_url)
        if self.broker_url is not None:
            _check_broker_url(self.broker_url)

    @property
    def outage_rule(self) -> OutageRule:
        """When a kind's provider counts as down, and how long its first hold lasts."""
        return OutageRule(self.outage_threshold, self.outage_limit, self.outage_hold)

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigurationError(
                "no database: set OUTBOX_DATABASE_URL (or DATABASE_URL), or pass --database-url"
                " (database_url= in code)"
            )
        return self.database_url

    def with_overrides(self, **overrides: Any) -> Settings:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            variable = env_name(f.name)
            raw = env.get(variable)
            if raw is None:
                continue
            if f.type == "timedelta":
                values[f.name] = timedelta(seconds=_seconds(variable, raw))
            elif f.type == "int":
                values[f.name] = _integer(variable, raw)
            else:
                values[f.name] = raw
        if "database_url" not in values and env.get("DATABASE_URL"):
            values["database_url"] = env["DATABASE_URL"]
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


def max_payload_bytes_from_env(environ: dict[str, str] | None = None) -> int:
    """``OUTBOX_MAX_PAYLOAD_BYTES`` (or the default), for an enqueue that was given no limit:
    read on each call, which costs far less than one round trip."""
    raw = (os.environ if environ is None else environ).get(f"{ENV_PREFIX}MAX_PAYLOAD_BYTES")
    if raw is None:
        return DEFAULT_MAX_PAYLOAD_BYTES
    variable = env_name("max_payload_bytes")
    value = _integer(variable, raw)
    if value < 1:
        raise ConfigurationError(f"{variable}: must be >= 1")
    return value


def health_dir_from_env(environ: dict[str, str] | None = None) -> str | None:
    """``OUTBOX_HEALTH_DIR``, read alone: the health probe needs no other setting, and a probe
    that a container runs every few seconds should not parse (or fail on) the rest."""
    return (os.environ if environ is None else environ).get(env_name("health_dir")) or None


def env_name(field: str) -> str:
    """The environment variable of a setting: ``lease`` -> ``OUTBOX_LEASE_SECONDS`` (durations
    are given in seconds), ``batch_size`` -> ``OUTBOX_BATCH_SIZE``."""
    types = {f.name: f.type for f in fields(Settings)}
    suffix = "_SECONDS" if types.get(field) == "timedelta" else ""
    return f"{ENV_PREFIX}{field.upper()}{suffix}"


def _seconds(variable: str, raw: str) -> float:
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{variable}: {raw!r} is not a number of seconds") from None
    if not 0 <= value < float("inf"):
        raise ConfigurationError(f"{variable}: {raw!r} must be a finite number >= 0")
    return value


def _integer(variable: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise ConfigurationError(f"{variable}: {raw!r} is not a whole number") from None


def _check_database_url(url: str) -> None:
    # Parsed here (libpq's own parser) so a typo is a configuration error before any connect;
    # the message never repeats the URL, which may hold a password.
    # psycopg is imported here, not with this module: a process that reads one setting and no
    # URL (``outbox health``, a container's probe every few seconds) does not load it.
    from psycopg import ProgrammingError
    from psycopg.conninfo import conninfo_to_dict

    variable = f"{env_name('database_url')} (--database-url)"
    try:
        params = conninfo_to_dict(url)
    except ProgrammingError as error:
        reason = str(error).splitlines()[0] if str(error) else "cannot be parsed"
        if url in reason:
            reason = "cannot be parsed"
        raise ConfigurationError(
            f"{variable}: not a PostgreSQL URL (postgresql://user@host:5432/db) or "
            f"connection string: {reason}"
        ) from None
    for port in str(params.get("port", "")).split(","):
        if port and not port.isdigit():
            raise ConfigurationError(f"{variable}: port {port!r} is not a number")


def _check_broker_url(url: str) -> None:
    variable = f"{env_name('broker_url')} (--broker-url)"
    parsed = urlparse(url)
    if parsed.scheme not in REDIS_SCHEMES + RABBITMQ_SCHEMES:
        raise ConfigurationError(
            f"{variable}: scheme must be redis:// (the default broker) or amqp://, "
            f"not {parsed.scheme + '://' if parsed.scheme else 'none'}"
        )
    try:
        parsed.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise ConfigurationError(f"{variable}: the port is not a number") from None
