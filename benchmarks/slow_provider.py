"""``slow-provider-1``, ``-2``, ``-4``: every provider call takes 200 ms (the adapter passes its
fence, then ``await asyncio.sleep(0.2)``, then ``Done``), end to end through a real ``outbox
claimer`` and a real ``outbox worker`` pool of 1, 2 and 4 processes; ``slow-provider-key-cap-128``
runs the 2-process pool's 128 slots over 128 workspaces, each capped at one action at a time
(``key_concurrency=1``, as an SMTP relay that allows one connection an account): the same ideal
of 640 a second. Each workspace's next action is claimed only once its last ended, so a claim
takes the few that ended since the claimer's last look and its messages carry a few actions
each: a thread holds a message until all its actions end, so the pool runs nearer its 16
threads' worth at once than its 128 slots. ``slow-provider-key-cap-128-32t`` runs the same with
32 threads a process (docs/scaling.md: size threads to the keys' caps under a key cap).
``key_end_to_claim_p50_ms``: how long a workspace waited from one attempt's end to its next
claim.

A pool runs at most ``processes x threads x actions a message`` attempts at once (a thread runs
one message at a time, the actions of a message run concurrently on the process's event loop),
so its ideal is that many calls every 200 ms; ``ratio`` is the steady throughput over that
ideal. The claimer's in-flight bound (``OUTBOX_IN_FLIGHT``) is twice the pool's concurrency, as
docs/scaling.md advises for a slow provider: the next messages wait in the broker, so a thread
that finishes one starts the next at once instead of waiting for the claimer's next look.

N is a whole number of "waves" of the pool's concurrency, enqueued in one transaction while the
claimer and the pool are idle. The steady throughput leaves out the start (the first claim
folds the whole backlog's lane intake): the actions after the first wave's worth, over the time
from the first wave's worth's end to the last end (exactly the ideal for a pool without
overhead). p50/p99 are enqueue commit -> DONE.

CPU ms an action of each process (and of PostgreSQL and Redis) say where the machine's CPU
ceiling is: ``cpu_bound_per_s`` is the rate the machine's cores would carry at that cost.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any

import psycopg

from benchmarks.common import (
    DATABASE_URL,
    NOOP,
    Result,
    Scale,
    all_ended,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.cpu import CpuMeter
from benchmarks.rig import ACTIONS_PER_MESSAGE, rig, wait_until
from outbox import ActionRequest, Outbox

#: How long each provider call takes.
PROVIDER_S = 0.2
#: Worker processes of each run.
POOL_SIZES = (1, 2, 4)
#: Threads a worker process: 8 x 8 actions a message = 64 calls at once, 320 a second at 200 ms.
#: The 4-process pool's ideal (1,280 a second) is about what 2 cores carry end to end, so the
#: rows show the pool's concurrency below the CPU ceiling and then the ceiling itself
#: (``cpu_bound_per_s`` says where it was in each run).
THREADS = 8
#: Threads a worker process of the second key-cap row: under a key cap a claim takes what ended
#: since the claimer's last look, so its messages carry a few actions and a pool runs about as
#: many attempts at once as it has threads; 2 x 32 threads cover the 128 keys.
KEY_CAP_THREADS = 32
#: The in-flight bound over the pool's concurrency: room for a second message a thread, waiting
#: in the broker (docs/scaling.md, "Sizing pools for slow providers").
IN_FLIGHT_PER_SLOT = 2
#: Waves of the pool's concurrency a run enqueues (a quick and a default run).
WAVES = (15, 50)
#: Below this ``--scale`` only the first pool size runs.
TINY = 0.1
#: Actions an ``enqueue_many`` call, all in one transaction.
PER_CALL = 1000


def slots(processes: int, threads: int = THREADS) -> int:
    """Attempts the pool runs at once."""
    return processes * threads * ACTIONS_PER_MESSAGE


def _request(i: int, keys: int | None) -> ActionRequest:
    """The ``i``-th action: a lane of its own; with ``keys``, in workspace ``i % keys``."""
    request = noop_request(f"slow-{i}", f"lane-{i}", i)
    return request if keys is None else replace(request, workspace_id=f"ws-{i % keys:04d}")


def _enqueue(outbox: Outbox, n: int, keys: int | None = None) -> float:
    """``n`` actions, one lane each (over ``keys`` workspaces when given, else one), in one
    transaction; the wall-clock time of its commit."""
    with psycopg.connect(DATABASE_URL) as conn:
        for start in range(0, n, PER_CALL):
            batch = range(start, min(n, start + PER_CALL))
            outbox.enqueue_many(conn, [_request(i, keys) for i in batch])
        conn.commit()
        return time.time()


#: Where an attempt's time goes, from its history row (database clock, p50 of all attempts):
#: claim -> take (the claimer's push, the broker, a free thread), take -> fence, fence -> end
#: (the provider call, then the finish statement).
PHASES = {
    "claim_to_take_p50_ms": "taken_at - claimed_at",
    "take_to_fence_p50_ms": "fence_passed_at - taken_at",
    "fence_to_end_p50_ms": "ended_at - fence_passed_at",
}


def _phases(conn: psycopg.Connection[Any], schema: str) -> dict[str, float | None]:
    columns = ", ".join(
        f"percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM {span}))"
        for span in PHASES.values()
    )
    row = conn.execute(f'SELECT {columns} FROM "{schema}".agent_action_attempt').fetchone()
    values = row if row is not None else (None,) * len(PHASES)
    return {
        name: None if value is None else ms(value)
        for name, value in zip(PHASES, values, strict=True)
    }


def _key_idle(conn: psycopg.Connection[Any], schema: str) -> float | None:
    """Under a key cap of one: p50 of the time a workspace waited between one attempt's end and
    its next attempt's claim (the claimer's look, its claim and the next push's start)."""
    row = conn.execute(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY extract(epoch FROM idle))"
        " FROM (SELECT t.claimed_at - lag(t.ended_at) OVER"
        " (PARTITION BY a.workspace_id ORDER BY t.claimed_at) AS idle"
        f' FROM "{schema}".agent_action_attempt t'
        f' JOIN "{schema}".agent_action a ON a.id = t.action_id) x WHERE idle IS NOT NULL'
    ).fetchone()
    return None if row is None or row[0] is None else ms(row[0])


def run_pool(
    scale: Scale, processes: int, keys: int | None = None, threads: int = THREADS
) -> Result:
    """``keys``: the actions are spread over that many workspaces, each capped at one action
    at a time (``key_concurrency=1``): the ideal is then that many calls every 200 ms, or the
    pool's concurrency if lower."""
    concurrency = slots(processes, threads)
    n = concurrency * scale.n(*WAVES, floor=2)
    ideal = min(concurrency, keys or concurrency) / PROVIDER_S
    settings = {
        "BENCH_PROVIDER_SECONDS": str(PROVIDER_S),
        "OUTBOX_IN_FLIGHT": str(concurrency * IN_FLIGHT_PER_SLOT),
    }
    if keys is not None:
        settings["OUTBOX_LIMITS"] = f"{NOOP.name}: key_concurrency=1"
    load = os.getloadavg()[0]
    name = f"slow-provider-{processes}"
    if keys is not None:
        name = f"slow-provider-key-cap-{keys}" + ("" if threads == THREADS else f"-{threads}t")
    with bench_schema(name) as schema, rig(schema, **settings) as r:
        outbox = migrated_outbox(schema)
        workers = r.outbox_workers(processes=processes, threads=threads)
        cpu = CpuMeter(claimer=r.claimer().pid, workers=workers.pid)
        table = f'"{schema}".agent_action'
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            cpu.start()
            committed = _enqueue(outbox, n, keys)
            wait_until(lambda: all_ended(watch, schema), 600, f"{name}: not ended", 0.02)
            cpu.stop()
            states = dict(
                watch.execute(f"SELECT state, count(*) FROM {table} GROUP BY state").fetchall()
            )
            ends = sorted(
                row[0]
                for row in watch.execute(
                    f"SELECT extract(epoch FROM ended_at)::float8 FROM {table}"
                )
            )
            phases = _phases(watch, schema)
            if keys is not None:
                phases["key_end_to_claim_p50_ms"] = _key_idle(watch, schema)
    if states != {"DONE": n}:
        raise AssertionError(f"{name}: not every action ended DONE: {states}")
    # The first wave's worth of ends, then the rest at the pool's steady pace.
    wave = min(concurrency, keys or concurrency)
    first = ends[wave - 1]
    per_s = (n - wave) / (ends[-1] - first)
    in_system = [end - committed for end in ends]
    cpu_ms = cpu.per_action_ms(n)
    # The services' CPU counts every process of theirs, other clients' too: a backend that
    # exited in between can make it negative, and then no ceiling is given. The total is their
    # sum already, so it is left out of this one.
    spent = [v for k, v in cpu_ms.items() if v is not None and k != "total_cpu_ms_per_action"]
    cores = os.cpu_count() or 1
    cpu_bound = cores * 1000 / sum(spent) if spent and min(spent) >= 0 and sum(spent) else None
    return Result(
        scenario=name,
        n=n,
        actions_per_s=round(per_s, 1),
        p50_ms=ms(percentile(in_system, 50)),
        p99_ms=ms(percentile(in_system, 99)),
        ratio=round(per_s / ideal, 3),
        ratio_to="ideal-concurrency",
        extra={
            "provider_ms": ms(PROVIDER_S),
            "processes": processes,
            "threads": threads,
            "actions_per_message": ACTIONS_PER_MESSAGE,
            "concurrency": concurrency,
            "key_cap": None if keys is None else {"keys": keys, "key_concurrency": 1},
            "in_flight_bound": concurrency * IN_FLIGHT_PER_SLOT,
            "ideal_per_s": round(ideal, 1),
            "wall_per_s": round(n / (ends[-1] - committed), 1),
            "first_wave_s": round(first - committed, 3),
            "actions_per_s_is": "steady: after the first wave's worth of ends, to the last",
            "latency_is": "enqueue commit -> DONE, the whole backlog enqueued at once",
            "cpu_bound_per_s": None if cpu_bound is None else round(cpu_bound, 1),
            "load_average_1m": round(load, 2),
            **phases,
            **cpu_ms,
        },
    )


def run(scale: Scale) -> list[Result]:
    # A tiny run (the smoke test's) checks the scenario, not the scaling: one pool, not three.
    sizes = POOL_SIZES if scale.factor >= TINY else POOL_SIZES[:1]
    rows = [run_pool(scale, processes) for processes in sizes]
    if scale.factor < TINY:
        return rows
    # The two-process pool's slots over as many workspaces capped at one each (the same ideal
    # as its uncapped row), then with the threads sized to the keys' caps.
    keys = slots(POOL_SIZES[1])
    return [
        *rows,
        run_pool(scale, POOL_SIZES[1], keys=keys),
        run_pool(scale, POOL_SIZES[1], keys=keys, threads=KEY_CAP_THREADS),
    ]
