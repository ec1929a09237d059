"""``load``: latency and CPU an action against the offered rate, up to the rate the pool
cannot keep up with (the knee).

An enqueuer offers ``RATES`` in turn, each for 20 s (8 s in a quick run; ``enqueue_many``,
``PER_TX`` a transaction, paced), to the common pool (a claimer and the workers of
``benchmarks.rig``), without a pause between steps. A step in which fewer than ``KEPT_UP`` of
its actions' worth ended, or whose backlog at its end is more than ``BEHIND_SECONDS`` of its
rate, fell behind: it is the last one run, and the actions left then drain.

One row a step, ``load-<rate>``: ``actions_per_s`` the actions that ended during the step a
second; p50/p99 of enqueue -> DONE (database clock) of the actions enqueued in the step;
``ratio`` the actions that ended during the step over those it offered (about 1.0 while the
pool keeps up); ``backlog_at_end`` the actions not ended when the step ended; and the CPU ms an
action of each process and service during the step (per action offered).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks.common import (
    DATABASE_URL,
    Result,
    Scale,
    all_ended,
    bench_schema,
    ended_count,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.cpu import CpuMeter
from benchmarks.rig import paced, rig, wait_until
from benchmarks.sustained import vacuumed
from outbox import Outbox

#: Offered actions/s, in turn (a default or quick run); the steps stop at the first that falls
#: behind.
RATES = (200, 400, 800, 1_600, 2_400, 3_200, 4_000)
#: A tiny run's (the smoke test's) steps.
TINY_RATES = (50, 100)
#: Actions an enqueueing transaction.
PER_TX = 20
#: A step falls behind when fewer actions than this share of its own ended during it...
KEPT_UP = 0.97
#: ... or when more than this many seconds of its rate are still waiting at its end.
BEHIND_SECONDS = 2.0
#: Seconds the actions still waiting after the last step may take to end.
DRAIN_TIMEOUT = 300
#: How often the scenario vacuums where the server's autovacuum is off (as ``sustained``).
VACUUM_EVERY = 15.0


@dataclass
class Step:
    """One offered rate: how many actions it enqueued and their ids, how long it lasted, what
    ended during it and what was left, and what it cost."""

    rate: int
    n: int
    first_id: int
    last_id: int
    took: float
    #: Actions (of any step) that ended during the step, and those not ended at its end.
    ended_in_step: int
    backlog: int
    cpu_ms: dict[str, float | None]

    @property
    def behind(self) -> bool:
        return self.ended_in_step < KEPT_UP * self.n or self.backlog > self.rate * BEHIND_SECONDS


def run(scale: Scale) -> list[Result]:
    tiny = scale.factor < 1
    rates = TINY_RATES if tiny else RATES
    seconds = 3.0 if tiny else scale.seconds(quick=8, full=20)
    steps: list[Step] = []
    with bench_schema("load") as schema, rig(schema) as r:
        outbox = migrated_outbox(schema)
        cpu = CpuMeter(enqueuer=os.getpid(), **r.idle_outbox())
        with (
            vacuumed(schema, VACUUM_EVERY),
            psycopg.connect(DATABASE_URL) as conn,
            psycopg.connect(DATABASE_URL, autocommit=True) as watch,
        ):
            offer = Offer(outbox, conn, watch, schema, cpu)
            for rate in rates:
                steps.append(offer.step(rate, seconds))
                if steps[-1].behind:
                    break
            wait_until(
                lambda: all_ended(watch, schema),
                DRAIN_TIMEOUT,
                "load: actions not ended",
                0.1,
            )
            return [_result(watch, schema, step) for step in steps]


@dataclass
class Offer:
    """The enqueuer: offers one rate after another on ``conn``, each action of a lane and an
    idempotency key of its own; ``watch`` reads the counts."""

    outbox: Outbox
    conn: psycopg.Connection[Any]
    watch: psycopg.Connection[Any]
    schema: str
    cpu: CpuMeter
    next_key: int = 0

    def step(self, rate: int, seconds: float) -> Step:
        ids: list[int] = []
        ended_before = ended_count(self.watch, self.schema)
        self.cpu.start()
        step_start = time.perf_counter()
        for _ in paced(int(seconds * rate / PER_TX), rate / PER_TX):
            first, self.next_key = self.next_key, self.next_key + PER_TX
            requests = [
                noop_request(f"load-{i}", f"lane-{i}", i) for i in range(first, first + PER_TX)
            ]
            ids.extend(action.id for action in self.outbox.enqueue_many(self.conn, requests))
            self.conn.commit()
        # The step lasts its whole time (the last transaction went out one interval before its
        # end), so that what ended in it is measured over the same span.
        time.sleep(max(0.0, step_start + seconds - time.perf_counter()))
        self.cpu.stop()
        return Step(
            rate=rate,
            n=len(ids),
            first_id=min(ids),
            last_id=max(ids),
            took=time.perf_counter() - step_start,
            ended_in_step=ended_count(self.watch, self.schema) - ended_before,
            backlog=ended_count(self.watch, self.schema, ended=False),
            cpu_ms=self.cpu.per_action_ms(len(ids)),
        )


def _result(watch: psycopg.Connection[Any], schema: str, step: Step) -> Result:
    table = f'"{schema}".agent_action'
    latencies = [
        row[0]
        for row in watch.execute(
            f"""SELECT extract(epoch FROM ended_at - created_at)::float8 FROM {table}
                 WHERE id BETWEEN %s AND %s AND state = 'DONE'""",
            [step.first_id, step.last_id],
        )
    ]
    if len(latencies) != step.n:
        raise AssertionError(f"load-{step.rate}: {len(latencies)} of {step.n} actions DONE")
    ended_per_s = step.ended_in_step / step.took
    return Result(
        scenario=f"load-{step.rate}",
        n=step.n,
        actions_per_s=round(ended_per_s, 1),
        p50_ms=ms(percentile(latencies, 50)),
        p99_ms=ms(percentile(latencies, 99)),
        ratio=round(step.ended_in_step / step.n, 3),
        ratio_to="offered",
        extra={
            "offered_per_s": step.rate,
            "enqueued_per_s": round(step.n / step.took, 1),
            "step_s": round(step.took, 2),
            "backlog_at_end": step.backlog,
            "fell_behind": step.behind,
            "latency_is": "enqueue transaction start -> DONE, database clock, under the load",
            **step.cpu_ms,
        },
    )
