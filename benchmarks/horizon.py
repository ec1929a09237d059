"""``horizon``: the in-process drain of ``inprocess``, batch after batch, while another session
holds a snapshot open, against the same batches with nothing held.

PostgreSQL cannot remove a row version that some open snapshot may still see: a report that runs
for minutes, a session left idle in a transaction, a replica with ``hot_standby_feedback``, a
prepared transaction or a stale replication slot hold back this "xmin horizon" for the whole
database. Every action leaves dead versions behind (its lane row, deleted when the lane empties;
the action's own earlier versions). While a snapshot may still see them, vacuum cannot remove
them and an index scan cannot mark their entries dead: each scan steps over every one it meets
and reads its row, so a queue's claims slow down the longer the horizon is held.

Each side runs 16 batches of 5,000 actions (6 of 2,500 in a quick run) in a schema of its own:
enqueue a batch (``enqueue_many``, one lane an action), then drain it with the executor of
``inprocess``. The held side first opens a REPEATABLE READ transaction on another connection and
reads once (its snapshot now holds the horizon), and keeps it until its last batch has drained.
The free side runs first, alone. Reported: the held side's late rate (``actions_per_s``: the
median rate of its last quarter of batches, where the dead rows are most; p50/p99 its last
batch's rounds), ``ratio`` it over the free side's late rate, each side's rate batch by batch,
and the buffers and the execution time of one ``claim_heads`` plan after the last batch (with a
batch waiting) on each side; that waiting batch is then drained once the snapshot is let go
(``released_per_s``).
"""

from __future__ import annotations

import statistics
import time
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import psycopg

from benchmarks.claim_cost import explain_claim_heads
from benchmarks.common import (
    DATABASE_URL,
    NOOP,
    Result,
    Scale,
    bench_schema,
    bulk_enqueue,
    migrated_outbox,
    ms,
    percentile,
)
from benchmarks.inprocess import NoopAdapter, run_all
from outbox import Outbox, event_loop


class Side:
    """One side's batches: each one's actions a second, the last one's rounds, how long its
    snapshot was held, a claim's buffers and time at the end, and the batch after it."""

    def __init__(self, held: bool) -> None:
        self.held = held
        self.rates: list[float] = []
        self.last_rounds: list[float] = []
        self.held_s = 0.0
        self.claim_buffers = 0
        self.claim_ms = 0.0
        self.after_rate = 0.0

    def run(self, batches: int, per_batch: int) -> None:
        name = "horizon_held" if self.held else "horizon_free"
        with bench_schema(name) as schema, holder_connection(self.held) as holder:
            outbox = migrated_outbox(schema)
            outbox.register(NOOP, NoopAdapter())
            started = time.perf_counter()
            if holder is not None:
                hold_snapshot(holder)
            for index in range(batches):
                bulk_enqueue(schema, per_batch, start=index * per_batch)
                seconds, rounds = _drain(outbox, per_batch)
                self.rates.append(per_batch / seconds)
                self.last_rounds = rounds
            # A batch waiting, as the next claim would meet it.
            bulk_enqueue(schema, per_batch, start=batches * per_batch)
            with psycopg.connect(DATABASE_URL) as conn:
                conn.execute(f'SELECT "{schema}".agent_action_lane_intake(%s)', (per_batch,))
                conn.commit()
                self.claim_buffers, self.claim_ms = explain_claim_heads(conn, schema)
            if holder is not None:
                self.held_s = time.perf_counter() - started
                holder.rollback()
            # That batch drained once nothing is held any more: how soon the held side recovers.
            seconds, _ = _drain(outbox, per_batch)
            self.after_rate = per_batch / seconds


def holder_connection(held: bool) -> AbstractContextManager[psycopg.Connection[Any] | None]:
    """The connection that holds the snapshot (the held side's only; ``pgqueuer-horizon``'s
    too)."""
    return psycopg.connect(DATABASE_URL) if held else nullcontext()


def _drain(outbox: Outbox, n: int) -> tuple[float, list[float]]:
    """Seconds to drain the ``n`` due actions, and each round's seconds."""
    seconds, _, rounds, _ = event_loop.run(run_all(outbox, n), outbox.settings.event_loop)
    return seconds, rounds


def hold_snapshot(holder: psycopg.Connection[Any]) -> None:
    """Opens a REPEATABLE READ transaction on ``holder`` and reads once: from now until it
    ends, its snapshot holds the database's vacuum horizon."""
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")  # the snapshot is taken at the first read


def late_rate(rates: list[float]) -> float:
    """The median rate of the last quarter of the batches (the last batch alone in a run of
    fewer than four): where the dead rows are most, and less at the mercy of one batch's noise
    than the last batch alone (a batch of 5,000 drains in about a second)."""
    return statistics.median(rates[-max(1, len(rates) // 4) :])


def sizes(scale: Scale) -> tuple[int, int]:
    """How many batches a side drains, and of how many actions (its peer's the same)."""
    return scale.n(6, 16, floor=2), scale.n(2_500, 5_000, floor=50)


def run(scale: Scale) -> list[Result]:
    batches, per_batch = sizes(scale)
    free, held = Side(held=False), Side(held=True)
    free.run(batches, per_batch)
    held.run(batches, per_batch)
    return [
        Result(
            scenario="horizon",
            n=batches * per_batch,
            actions_per_s=round(late_rate(held.rates), 1),
            p50_ms=ms(percentile(held.last_rounds, 50)),
            p99_ms=ms(percentile(held.last_rounds, 99)),
            ratio=round(late_rate(held.rates) / late_rate(free.rates), 3),
            ratio_to="horizon-free",
            extra={
                "batches": batches,
                "per_batch": per_batch,
                "latency_is": "one claim_and_run round of the held side's last batch",
                "held_s": round(held.held_s, 1),
                "held_per_s": [round(rate) for rate in held.rates],
                "free_per_s": [round(rate) for rate in free.rates],
                "held_claim_buffers": held.claim_buffers,
                "free_claim_buffers": free.claim_buffers,
                "released_per_s": round(held.after_rate),
                "held_claim_ms": round(held.claim_ms, 2),
                "free_claim_ms": round(free.claim_ms, 2),
            },
        )
    ]
