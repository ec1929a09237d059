"""``lanes-50``, ``lanes-1000``: 2,000 actions over 50 lanes and 10,000 over 1,000 lanes, run end
to end (a real ``outbox claimer``, a real ``outbox worker`` pool through Dramatiq) while the
application still enqueues them: ``ENQUEUERS`` threads at once, each with a connection of its own
and lanes of its own, ``enqueue_many`` of ``PER_TX`` actions a transaction. A lane runs one
action at a time, in id order, so the rate is bound by how fast a lane's next head is claimed
after its predecessor finished, as many lanes at once as the pool runs.

The clock runs from the first enqueue until the last action is DONE. Afterwards every action must
have ended DONE with exactly one attempt past its fence, and every lane must have run in id
order, each action taken only after its predecessor ended (the scenario raises otherwise: no
number from a broken run). The tables are ANALYZEd once the enqueuers are done (``analyze``),
as the peer's are. Errors the enqueueing transactions raised are counted
(``enqueue_errors``, each failed batch is tried again) and must be zero. ``ratio`` is over
``dramatiq-raw``'s throughput measured just before; ``lanes-*-vs-procrastinate`` compares with
procrastinate's locks when ``--peers`` ran them in the same run.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks import dramatiq_raw
from benchmarks.common import (
    DATABASE_URL,
    Result,
    Scale,
    all_ended,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.rig import rig, wait_until
from outbox import Outbox

#: (actions, lanes) of each row; its name is ``lanes-<lanes>``.
SHAPES = ((2_000, 50), (10_000, 1_000))
#: Enqueueing threads at once, and actions a transaction of each.
ENQUEUERS = 4
PER_TX = 100
#: Tries of an enqueueing transaction before the scenario gives up.
TRIES = 5


@dataclass(frozen=True)
class Record:
    """One action (or a peer's job) as it ran: its lane, id, end state, how many attempts passed
    the fence (started), when it was enqueued, when its run started and when it ended (epoch
    seconds, database clock)."""

    lane: str
    id: int
    state: str
    runs: int
    created: float
    start: float
    end: float


def shapes(scale: Scale) -> Iterator[tuple[str, int, int]]:
    """(name, actions, lanes) of each row. A tiny run (the smoke test) keeps several actions a
    lane (100 over 20 lanes), under the same name."""
    for n, lanes in SHAPES:
        actions = scale.n(n, n, floor=100)
        yield f"lanes-{lanes}", actions, max(20, min(lanes, int(lanes * scale.factor)))


def plan(n: int, lanes: int) -> list[list[list[int]]]:
    """Each enqueuer's transactions (lists of action numbers; action i is of lane i % lanes).
    An enqueuer owns whole lanes, so a lane's transactions commit one after the other and its
    id order is its enqueue order (concurrent transactions into one lane may commit out of id
    order, docs/concepts.md)."""
    own: list[list[int]] = [[] for _ in range(ENQUEUERS)]
    for i in range(n):
        own[(i % lanes) % ENQUEUERS].append(i)
    return [[mine[k : k + PER_TX] for k in range(0, len(mine), PER_TX)] for mine in own]


def check(records: Iterable[Record], n: int, scenario: str) -> None:
    """Raises unless there are ``n`` records, each DONE after exactly one run, and every lane
    ran in id order with each run starting only after its predecessor ended."""
    records = list(records)
    if len(records) != n:
        raise AssertionError(f"{scenario}: {len(records)} actions, expected {n}")
    wrong = [r for r in records if r.state != "DONE" or r.runs != 1]
    if wrong:
        raise AssertionError(f"{scenario}: {len(wrong)} not DONE exactly once, e.g. {wrong[0]}")
    by_lane: dict[str, list[Record]] = defaultdict(list)
    for r in records:
        by_lane[r.lane].append(r)
    for lane, runs in by_lane.items():
        runs.sort(key=lambda r: r.id)
        for earlier, later in itertools.pairwise(runs):
            if later.start < earlier.end:
                raise AssertionError(
                    f"{scenario}: lane {lane} ran {later.id} (started {later.start:.6f}) before "
                    f"{earlier.id} ended ({earlier.end:.6f})"
                )


def analyze(watch: psycopg.Connection[Any], schema: str, *tables: str) -> None:
    """ANALYZE the tables a run filled, once its enqueuers are done, as autovacuum would on a
    table that grew from empty. Without statistics a fresh table looks empty to the planner:
    procrastinate's fetch, planned so, ran 0.8 jobs/s over 1,000 locks instead of about 50.
    The outbox's and the peer's tables get the same treatment, inside the clock."""
    for table in tables:
        watch.execute(f'ANALYZE "{schema}".{table}')


def _enqueue_all(outbox: Outbox, n: int, lanes: int) -> int:
    """Runs the enqueuers at once; returns how many enqueueing transactions failed."""
    errors = [0] * ENQUEUERS
    failures: list[BaseException] = []

    def enqueuer(index: int, batches: list[list[int]]) -> None:
        try:
            with psycopg.connect(DATABASE_URL) as conn:
                for batch in batches:
                    requests = [noop_request(f"lanes-{i}", f"lane-{i % lanes}", i) for i in batch]
                    for _ in range(TRIES):
                        try:
                            outbox.enqueue_many(conn, requests)
                            conn.commit()
                            break
                        except psycopg.Error:
                            conn.rollback()
                            errors[index] += 1
                    else:
                        raise RuntimeError(f"an enqueue of {len(batch)} failed {TRIES} times")
        except BaseException as exc:
            failures.append(exc)

    threads = [
        threading.Thread(target=enqueuer, args=(index, batches))
        for index, batches in enumerate(plan(n, lanes))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return sum(errors)


def records(watch: psycopg.Connection[Any], schema: str) -> list[Record]:
    """Every action with its attempts past the fence: the first one's take is its start."""
    rows = watch.execute(
        f"""SELECT a.lane_key, a.id, a.state,
                   count(h.action_id),
                   extract(epoch FROM a.created_at)::float8,
                   extract(epoch FROM min(h.taken_at))::float8,
                   extract(epoch FROM a.ended_at)::float8
              FROM "{schema}".agent_action a
              LEFT JOIN "{schema}".agent_action_attempt h
                ON h.action_id = a.id AND h.fence_passed_at IS NOT NULL
             GROUP BY a.id"""
    ).fetchall()
    return [Record(*row) for row in rows]


def run_once(name: str, n: int, lanes: int, ceiling_per_s: float) -> Result:
    with bench_schema(name) as schema, rig(schema) as r:
        outbox = migrated_outbox(schema)
        r.outbox_workers()
        r.claimer()
        with psycopg.connect(DATABASE_URL, autocommit=True) as watch:
            started = time.perf_counter()
            errors = _enqueue_all(outbox, n, lanes)
            enqueued = time.perf_counter()
            analyze(watch, schema, "agent_action", "agent_action_lane")
            done_at = wait_until(
                lambda: all_ended(watch, schema), 600, f"{name} actions not ended", 0.02
            )
            ran = records(watch, schema)
    check(ran, n, name)
    per_s = n / (done_at - started)
    in_system = [r.end - r.created for r in ran]
    return Result(
        scenario=name,
        n=n,
        actions_per_s=round(per_s, 1),
        p50_ms=ms(percentile(in_system, 50)),
        p99_ms=ms(percentile(in_system, 99)),
        ratio=round(per_s / ceiling_per_s, 3),
        ratio_to="dramatiq-raw",
        extra={
            "lanes": lanes,
            "enqueuers": ENQUEUERS,
            "per_tx": PER_TX,
            "enqueue_errors": errors,
            "enqueue_s": round(enqueued - started, 2),
            "ceiling_per_s": round(ceiling_per_s, 1),
            "checked": "every action DONE once, every lane in id order",
            "latency_is": "enqueue transaction start -> DONE, database clock, under load",
        },
    )


def run(scale: Scale) -> list[Result]:
    return [
        run_once(name, n, lanes, dramatiq_raw.throughput(n).per_s)
        for name, n, lanes in shapes(scale)
    ]
