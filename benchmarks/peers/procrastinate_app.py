"""procrastinate on a scenario's schema: a ``search_path`` on every connection of its pool (the
way procrastinate's docs put it in a schema of its own), so ``apply_schema`` creates its tables
and functions there and every query of it finds them; its queue is named after the run (its
NOTIFY channel is the queue's), so another run's workers never wake for this one's jobs.

``python -m benchmarks.peers.procrastinate_app SCHEMA``: a worker process (``run_worker`` with
``CONCURRENCY`` sub-workers) of the scenario's queue; its no-op task records the wall-clock time
it started (Redis hash ``STARTS_KEY``, by job id) when its arguments ask.
"""

from __future__ import annotations

import asyncio
import sys
import time
from functools import cache

import procrastinate
import redis.asyncio

from benchmarks.common import DATABASE_URL, REDIS_URL, RUN_ID
from benchmarks.rig import PROCESSES, THREADS

#: The run's queue and the no-op task's name.
QUEUE = f"bench_{RUN_ID}"
TASK = "bench_noop"
STARTS_KEY = f"bench:{RUN_ID}:procrastinate:starts"
READY = "procrastinate worker ready"
#: Worker processes and sub-workers of each (``--concurrency``): the outbox pool's layout
#: (processes x threads), as procrastinate's docs scale a worker (``concurrency=30`` there).
WORKERS = PROCESSES
CONCURRENCY = THREADS
#: Connections of a worker's pool: as many as an outbox worker process's (``pool_size``).
POOL_SIZE = 10


@cache
def _redis() -> redis.asyncio.Redis:
    return redis.asyncio.Redis.from_url(REDIS_URL)


def make_app(schema: str, pool_size: int = POOL_SIZE) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(
        conninfo=DATABASE_URL,
        kwargs={"options": f"-c search_path={schema}"},
        min_size=1,
        max_size=pool_size,
    )
    app = procrastinate.App(connector=connector)

    @app.task(name=TASK, queue=QUEUE, pass_context=True)
    async def noop(context: procrastinate.JobContext, i: int = 0, record: bool = False) -> None:
        if record:
            started = time.time()
            await _redis().hset(STARTS_KEY, str(context.job.id), repr(started))

    return app


async def _work(schema: str) -> None:
    app = make_app(schema)
    async with app.open_async():
        print(READY, flush=True)
        await app.run_worker_async(queues=[QUEUE], concurrency=CONCURRENCY)


if __name__ == "__main__":
    asyncio.run(_work(sys.argv[1]))
