"""pgqueuer on a scenario's schema: every table, type and function of it in that schema
(pgqueuer's ``db_schema`` setting) and its NOTIFY channel named after the schema (channels are
database-wide, so another run's consumers never wake for this one's jobs).

``python -m benchmarks.peers.pgqueuer_app SCHEMA``: an idle consumer for the latency scenario,
one ``PgQueuer`` on a psycopg connection with pgqueuer's defaults (batch size 10), whose no-op
entrypoint records the wall-clock time it started (Redis hash ``STARTS_KEY``, by job id).
"""

from __future__ import annotations

import sys
import time

import psycopg
import redis.asyncio
import uvloop
from pgqueuer import PgQueuer
from pgqueuer.adapters.persistence import qb
from pgqueuer.db import PsycopgDriver
from pgqueuer.domain.settings import DBSettings
from pgqueuer.models import Job
from pgqueuer.queries import Queries
from pgqueuer.types import Channel

from benchmarks.common import DATABASE_URL, REDIS_URL, RUN_ID

#: The no-op job's entrypoint.
ENTRYPOINT = "bench_noop"
#: Where the latency consumer records each job's start.
STARTS_KEY = f"bench:{RUN_ID}:pgqueuer:starts"
#: What the consumer prints once its entrypoint is registered.
READY = "pgqueuer consumer ready"


def settings(schema: str) -> DBSettings:
    return DBSettings(db_schema=schema, channel=f"{schema}_ch_pgqueuer")


async def connect(schema: str) -> tuple[Queries, psycopg.AsyncConnection]:
    """pgqueuer's queries on a connection of their own (autocommit, as pgqueuer requires)."""
    conn = await psycopg.AsyncConnection.connect(DATABASE_URL, autocommit=True)
    names = settings(schema)
    q = Queries(
        PsycopgDriver(conn),
        qbe=qb.QueryBuilderEnvironment(names),
        qbq=qb.QueryQueueBuilder(names),
        qbs=qb.QuerySchedulerBuilder(names),
    )
    return q, conn


def consumer(q: Queries, schema: str) -> PgQueuer:
    return PgQueuer(q.driver, channel=Channel(settings(schema).channel), queries=q)


async def _consume(schema: str) -> None:
    client = redis.asyncio.Redis.from_url(REDIS_URL)
    q, _ = await connect(schema)
    pgq = consumer(q, schema)

    @pgq.entrypoint(ENTRYPOINT)
    async def noop(job: Job) -> None:
        started = time.time()
        await client.hset(STARTS_KEY, str(job.id), repr(started))

    print(READY, flush=True)
    await pgq.run()


if __name__ == "__main__":
    uvloop.run(_consume(sys.argv[1]))
