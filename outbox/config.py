"""Settings of an ``Outbox``: from the environment (prefix ``OUTBOX_``), overridable in code."""

from __future__ import annotations

import os
from dataclasses import dataclass, fields, replace
from datetime import timedelta
from typing import Any

from outbox.errors import ConfigurationError
from outbox.queries import validate_schema
from outbox.request_checks import DEFAULT_MAX_PAYLOAD_BYTES

#: The prefix of every environment variable the outbox reads.
ENV_PREFIX = "OUTBOX_"


@dataclass(frozen=True, slots=True)
class Settings:
    """Every knob, with the default a production deployment starts from.

    Durations are given in seconds in the environment (``OUTBOX_LEASE_SECONDS=300``).
    """

    #: PostgreSQL URL (``OUTBOX_DATABASE_URL``, else ``DATABASE_URL``).
    database_url: str | None = None
    #: The PostgreSQL schema that holds the outbox's tables.
    schema: str = "outbox"
    #: Dramatiq broker URL: redis://... (the default broker) or amqp://...
    broker_url: str | None = None
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
    #: of one kind share messages, which a worker runs concurrently on its event loop: Dramatiq's
    #: own cost a message (consume, decode, ack) was most of a worker's CPU. 1 = one message
    #: an action.
    actions_per_message: int = 8
    #: Retry backoff: base * 2^(attempt-1), capped, with jitter, unless the adapter gives a wait.
    retry_base: timedelta = timedelta(seconds=5)
    retry_cap: timedelta = timedelta(hours=1)
    #: Ended actions are deleted this long after they ended.
    retention: timedelta = timedelta(days=30)
    #: The claimer polls this often when no NOTIFY wakes it.
    poll_interval: timedelta = timedelta(seconds=1)
    #: Housekeeping (lost leases, expiry, retention) runs this often in the claimer.
    housekeeping_interval: timedelta = timedelta(seconds=5)
    #: Connections in each process's pool.
    pool_size: int = 10
    #: Port of the Prometheus endpoint (0 = none).
    metrics_port: int = 0
    #: Largest payload an enqueue accepts, in bytes of its compact UTF-8 JSON. A payload holds
    #: identifiers the adapter reads the rest by; a larger one is refused (InvalidActionRequest).
    max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES

    def __post_init__(self) -> None:
        validate_schema(self.schema)
        if self.write_margin >= self.lease:
            raise ConfigurationError(
                f"write_margin ({self.write_margin}) must be shorter than the lease ({self.lease})"
            )
        for name in (
            "batch_size",
            "in_flight",
            "actions_per_message",
            "pool_size",
            "max_payload_bytes",
        ):
            if getattr(self, name) < 1:
                raise ConfigurationError(f"{name} must be >= 1")

    def require_database_url(self) -> str:
        if not self.database_url:
            raise ConfigurationError(
                "no database: set OUTBOX_DATABASE_URL (or DATABASE_URL), or pass database_url="
            )
        return self.database_url

    def with_overrides(self, **overrides: Any) -> Settings:
        return replace(self, **{k: v for k, v in overrides.items() if v is not None})

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None, **overrides: Any) -> Settings:
        env = os.environ if environ is None else environ
        values: dict[str, Any] = {}
        for f in fields(cls):
            if f.type in ("timedelta",):
                raw = env.get(f"{ENV_PREFIX}{f.name.upper()}_SECONDS")
                if raw is not None:
                    values[f.name] = timedelta(seconds=_number(f.name, raw))
                continue
            raw = env.get(f"{ENV_PREFIX}{f.name.upper()}")
            if raw is None:
                continue
            values[f.name] = int(_number(f.name, raw)) if f.type == "int" else raw
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
    value = int(_number("max_payload_bytes", raw))
    if value < 1:
        raise ConfigurationError(f"{ENV_PREFIX}MAX_PAYLOAD_BYTES must be >= 1")
    return value


def _number(name: str, raw: str) -> float:
    try:
        return float(raw)
    except ValueError:
        raise ConfigurationError(f"{ENV_PREFIX}{name.upper()}: {raw!r} is not a number") from None
