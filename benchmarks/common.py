"""What every scenario shares: where the services are, its own schema, timing and the result row."""

from __future__ import annotations

import math
import os
import re
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg

from outbox import ActionKind, Outbox

#: The services the benchmarks talk to; only 127.0.0.1 by default (the same as the tests').
DATABASE_URL = os.environ.get(
    "OUTBOX_BENCH_DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/test"
)
#: Redis DB 14 is the benchmarks'; each run uses keys and queues of its own there. The
#: scenarios record what they read back (adapter starts, counts) here whatever the broker.
REDIS_URL = os.environ.get("OUTBOX_BENCH_REDIS_URL", "redis://127.0.0.1:6379/14")
#: The RabbitMQ of the ``rabbitmq`` scenarios; each run declares queues of its own there.
AMQP_URL = os.environ.get("OUTBOX_BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672/%2F")

#: Names this run's schemas, kind, queues and Redis keys, so that runs at the same time (a CI
#: job's smoke test next to a developer's run) never see, flush or drop each other's.
RUN_ID = os.environ.setdefault("OUTBOX_BENCH_RUN_ID", f"r{os.getpid()}")
if not re.fullmatch(r"[a-z0-9_]{1,20}", RUN_ID):
    raise ValueError(f"OUTBOX_BENCH_RUN_ID {RUN_ID!r}: 1-20 of a-z, 0-9, _")


def noop_kind(run_id: str) -> ActionKind:
    """A run's no-op kind (read-back: nothing refuses a reclaim)."""
    return ActionKind(f"BENCH_NOOP_{run_id.upper()}")


#: The no-op kind every throughput scenario of this run runs.
NOOP = noop_kind(RUN_ID)


@dataclass
class Result:
    """One line of the report. ``ratio`` is this scenario's number over ``ratio_to``'s."""

    scenario: str
    n: int
    actions_per_s: float | None
    p50_ms: float | None
    p99_ms: float | None
    ratio: float | None = None
    ratio_to: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        row = asdict(self)
        extra = row.pop("extra")
        return {**row, **extra}


@dataclass(frozen=True)
class Scale:
    """How big a run is: ``--quick`` (about two minutes) or the default (about ten)."""

    quick: bool
    #: Multiplies every N; the smoke test runs with a tiny one.
    factor: float = 1.0

    def n(self, quick: int, full: int, floor: int = 1) -> int:
        return max(floor, int((quick if self.quick else full) * self.factor))

    def seconds(self, quick: float, full: float) -> float:
        """A duration (of a ceiling measurement), cut down with the factor to at least 1 s."""
        base = quick if self.quick else full
        return max(1.0, base * min(1.0, self.factor))


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest rank: p99 of 100 samples is the 99th smallest."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


def ms(seconds: float) -> float:
    return round(seconds * 1000, 3)


@contextmanager
def bench_schema(name: str, database_url: str = DATABASE_URL) -> Iterator[str]:
    """``bench_<name>_<run id>``, empty at the start and dropped at the end (also on failure)."""
    schema = f"bench_{name.replace('-', '_')}_{RUN_ID}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
    try:
        yield schema
    finally:
        with psycopg.connect(database_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def migrated_outbox(schema: str, database_url: str = DATABASE_URL, **overrides: Any) -> Outbox:
    """An ``Outbox`` on ``schema`` that knows the no-op kind, migrated."""
    outbox = Outbox(database_url, schema=schema, **overrides)
    outbox.declare(NOOP)
    outbox.migrate()
    return outbox


def noop_request(key: str, lane: str | None = None, i: int = 0, body: str | None = None) -> Any:
    """An ``ActionRequest`` of the no-op kind: idempotency key ``key``, its own lane unless
    ``lane`` is given; its payload carries ``body`` too when given."""
    from outbox import ActionRequest

    return ActionRequest(
        kind=NOOP.name,
        workspace_id="w",
        lane_key=lane or key,
        idempotency_key=key,
        payload={"i": i} if body is None else {"i": i, "body": body},
    )


def bulk_enqueue(
    schema: str,
    n: int,
    *,
    lanes: int | None = None,
    start: int = 0,
    database_url: str = DATABASE_URL,
) -> None:
    """``n`` admitted no-op actions through the real batch enqueue (``enqueue_many``), 1,000 a
    call and a transaction, as pgqueuer's drain enqueues its jobs in one call.

    ``lanes`` spreads them over that many lanes (default: one lane each, as independent
    notifications would be); ``start`` numbers the first (keys and lanes), so that later calls
    on the same schema add new actions."""
    from outbox import enqueue_many

    end = start + n
    with psycopg.connect(database_url) as conn:
        for first in range(start, end, 1000):
            requests = [
                noop_request(f"noop-{i}", f"lane-{i if lanes is None else i % lanes}", i)
                for i in range(first, min(end, first + 1000))
            ]
            enqueue_many(conn, requests, schema=schema)
            conn.commit()


def ended_count(conn: psycopg.Connection[Any], schema: str, *, ended: bool = True) -> int:
    """How many actions of the scenario's schema have ended (with ``ended`` False: have not)
    (an autocommit connection)."""
    which = "IS NOT NULL" if ended else "IS NULL"
    row = conn.execute(
        f'SELECT count(*) FROM "{schema}".agent_action WHERE ended_at {which}'
    ).fetchone()
    return row[0] if row else 0


def all_ended(conn: psycopg.Connection[Any], schema: str) -> bool:
    """Whether no action of the scenario's schema waits or executes any more (an autocommit
    connection): what a scenario polls, every 20 ms or so, while its pipeline drains what it
    enqueued.

    Two probes of the live actions' partial indexes (``ix_agent_action_lane_waiting``,
    ``ux_agent_action_lane_executing``), sequential scans off for the statement, so a poll costs
    the server about the same however many actions have ended. ``ended_count`` reads every
    ended action's row: polled every 50 ms through a drain of 200,000 it read 43 million rows,
    about 0.1 ms of the server's 0.36 ms of CPU an action, the harness's and not the outbox's."""
    table = f'"{schema}".agent_action'
    with conn.transaction():
        conn.execute("SET LOCAL enable_seqscan = off")
        row = conn.execute(
            f"SELECT NOT EXISTS (SELECT 1 FROM {table} WHERE state IN ('PROPOSED', 'ADMITTED'))"
            f" AND NOT EXISTS (SELECT 1 FROM {table} WHERE state = 'EXECUTING')"
        ).fetchone()
    return bool(row and row[0])


def first_attempts(conn: psycopg.Connection[Any], schema: str) -> dict[int, tuple[float, float]]:
    """Each action's first attempt: its claim's and its take's times (epoch seconds, the
    database clock), by action id."""
    rows = conn.execute(
        f"SELECT action_id, extract(epoch FROM claimed_at)::float8,"
        f' extract(epoch FROM taken_at)::float8 FROM "{schema}".agent_action_attempt'
        " WHERE attempt = 1"
    ).fetchall()
    return {row[0]: (row[1], row[2]) for row in rows}
