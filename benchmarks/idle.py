"""``idle``: what a deployment costs while nothing is enqueued. A claimer and the common worker
pool (``benchmarks.rig``) are started on an empty schema, left alone for a while (``SETTLE``: their
start is not what is measured), then watched for ``WINDOW`` seconds: the CPU of each process tree
and of the services, as a share of one core (``<name>_cpu_pct``; ``total_cpu_pct`` their sum),
the transactions the database committed or rolled back a second (``pg_xacts_per_s``, everyone's:
nothing else runs during a benchmark), and the commands Redis processed a second
(``redis_commands_per_s``).

An idle deployment is most of a deployment's hours; what it costs then is paid by every
application that has few actions, in CPU and, on a managed database billed by its activity, in
the statements that keep it awake. Its peers (``pgqueuer-idle``, ``procrastinate-idle``) watch
their idle consumers the same way, and ``idle-vs-<peer>`` compares the CPU in all.

The rows carry no rate or latency: ``n`` is the seconds watched, and ``ratio`` the CPU in all
as a fraction of one core (``ratio_to`` "one-core").
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import psycopg
import redis

from benchmarks.common import DATABASE_URL, REDIS_URL, Result, Scale, bench_schema, migrated_outbox
from benchmarks.cpu import CpuMeter
from benchmarks.rig import PROCESSES, THREADS, rig

#: Seconds the started processes are left alone before the window (a quick and a default run).
SETTLE = (3.0, 5.0)
#: Seconds watched (a quick and a default run). A backend reports its transaction counts at most
#: once a second, so a short window reads them roughly.
WINDOW = (10.0, 60.0)

_XACTS = (
    "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = current_database()"
)


@dataclass(frozen=True)
class Watch:
    """How long the processes settle and how long they are watched, in seconds."""

    settle: float
    window: float

    @classmethod
    def of(cls, scale: Scale) -> Watch:
        return cls(scale.seconds(*SETTLE), scale.seconds(*WINDOW))


def watched(name: str, watch: Watch, layout: dict[str, object], **roots: int) -> Result:
    """The idle row ``name`` of the process trees ``roots`` (by name), already started: they
    settle, then the window is read. What the reading itself sends (two statements, two Redis
    commands) is left out."""
    time.sleep(watch.settle)
    meter = CpuMeter(**roots)
    with (
        psycopg.connect(DATABASE_URL, autocommit=True) as conn,
        redis.Redis.from_url(REDIS_URL) as client,
    ):
        xacts = _count(conn)
        commands = int(client.info("stats")["total_commands_processed"])
        meter.start()
        started = time.perf_counter()
        time.sleep(watch.window)
        meter.stop()
        seconds = time.perf_counter() - started
        xacts = _count(conn) - xacts - 1
        commands = int(client.info("stats")["total_commands_processed"]) - commands - 1
    shares = {
        f"{part}_cpu_pct": None if used is None else round(used / seconds * 100, 3)
        for part, used in meter.used.items()
    }
    known = [share for share in shares.values() if share is not None]
    total = round(sum(known), 3) if len(known) == len(shares) else None
    return Result(
        scenario=name,
        n=round(seconds),
        actions_per_s=None,
        p50_ms=None,
        p99_ms=None,
        ratio=None if total is None else round(total / 100, 5),
        ratio_to="one-core",
        extra={
            "window_s": round(seconds, 1),
            **shares,
            "total_cpu_pct": total,
            "pg_xacts_per_s": round(max(0, xacts) / seconds, 2),
            "redis_commands_per_s": round(max(0, commands) / seconds, 2),
            **layout,
        },
    )


def _count(conn: psycopg.Connection[tuple[int]]) -> int:
    row = conn.execute(_XACTS).fetchone()
    return int(row[0]) if row else 0


def run(scale: Scale) -> list[Result]:
    with bench_schema("idle") as schema:
        migrated_outbox(schema)
        with rig(schema) as r:
            pids = r.idle_outbox()
            layout = {"processes": PROCESSES, "threads": THREADS}
            return [watched("idle", Watch.of(scale), layout, **pids)]
