"""``claim-round``: what one dispatch claim round costs its claimer, by how many kinds have work.

A claimer (``outbox.dispatch.Claimer``, in this process, its pool on the benchmark's
PostgreSQL) serves ``KINDS`` kinds. Before each round, one action of each of ``busy`` kinds is
enqueued on a lane of its own; the round (``Claimer.claim``: the opening query, each busy kind's
claim and the COMMIT, nothing pushed) is timed by the wall clock and by this process's CPU, and
its claims are then ended, untimed, so every round starts from the same table. Rows:
``claim-round-1-kind`` and ``claim-round-<KINDS>-kinds``; ``actions_per_s`` is the claims a
second of round time; ``ratio`` is a row's p50 over the p50 with a single busy kind: what the
other busy kinds add to a round.
"""

from __future__ import annotations

import time

import psycopg

from benchmarks.common import (
    DATABASE_URL,
    NOOP,
    REDIS_URL,
    RUN_ID,
    Result,
    Scale,
    bench_schema,
    ms,
    percentile,
)
from outbox import ActionAttempt, ActionKind, ActionRequest, Done, Outbox, event_loop
from outbox import Result as ActionResult
from outbox.dispatch import Claimer, broker_from_url, install
from outbox.dispatch.fabric import Fabric
from outbox.results import Finish
from outbox.state import ActionState

#: Kinds the claimer serves; the second row has every one of them busy.
KINDS = 4
#: First rounds left out of the figures: the pool's and psycopg's first statements.
WARM_UP = 20


class _Unused:
    """The kinds' adapter: the claimer installs an actor a kind, and no worker runs here."""

    async def execute(self, attempt: ActionAttempt) -> ActionResult:
        return Done(ref="unused")


def _kinds() -> list[ActionKind]:
    return [NOOP, *(ActionKind(f"BENCH_ROUND_{i}_{RUN_ID.upper()}") for i in range(1, KINDS))]


def run(scale: Scale) -> list[Result]:
    rounds = scale.n(300, 1000, floor=WARM_UP + 5)
    with bench_schema("claim-round") as schema:
        outbox = Outbox(DATABASE_URL, schema=schema)
        kinds = _kinds()
        for kind in kinds:
            outbox.register(kind, _Unused())
        outbox.migrate()
        dispatch = install(outbox, broker_from_url(REDIS_URL))
        loop = outbox.settings.event_loop
        one = event_loop.run(_rounds(outbox, dispatch, kinds[:1], rounds), loop)
        every = event_loop.run(_rounds(outbox, dispatch, kinds, rounds), loop)
    rows = [one.result("claim-round-1-kind"), every.result(f"claim-round-{KINDS}-kinds")]
    for row, timings in zip(rows, (one, every), strict=True):
        row.ratio = round(timings.p50 / one.p50, 3)
        row.ratio_to = "claim-round-1-kind p50"
    return rows


class _Timings:
    def __init__(self, busy: int) -> None:
        self.busy = busy
        self.walls: list[float] = []
        self.cpus: list[float] = []

    @property
    def p50(self) -> float:
        return percentile(self.walls[WARM_UP:], 50)

    def result(self, name: str) -> Result:
        walls, cpus = self.walls[WARM_UP:], self.cpus[WARM_UP:]
        return Result(
            name,
            len(walls),
            # Claims a second of round time (the rounds only, not the enqueues between them).
            round(self.busy * len(walls) / sum(walls), 1),
            ms(percentile(walls, 50)),
            ms(percentile(walls, 99)),
            extra={
                "busy_kinds": self.busy,
                "kinds_served": KINDS,
                "p90_ms": ms(percentile(walls, 90)),
                "claimer_cpu_ms_per_round": ms(sum(cpus) / len(cpus)),
            },
        )


async def _rounds(outbox: Outbox, dispatch: Fabric, busy: list[ActionKind], n: int) -> _Timings:
    timings = _Timings(len(busy))
    with psycopg.connect(DATABASE_URL, autocommit=True) as conn:
        async with outbox.store() as store:
            claimer = Claimer(dispatch, store)
            for r in range(n):
                with conn.transaction():
                    for kind in busy:
                        key = f"{len(busy)}-{r}-{kind.name}"
                        outbox.enqueue(
                            conn,
                            ActionRequest(
                                kind, lane_key=key, idempotency_key=key, workspace_id="w"
                            ),
                        )
                wall, cpu = time.perf_counter(), time.process_time()
                round_ = await claimer.claim()
                timings.walls.append(time.perf_counter() - wall)
                timings.cpus.append(time.process_time() - cpu)
                if len(round_.claimed) != len(busy):
                    raise RuntimeError(f"a round claimed {len(round_.claimed)} of {len(busy)}")
                for item in round_.claimed:
                    await store.finish(item.action.token, Finish(ActionState.DONE, "DONE"))
    return timings
