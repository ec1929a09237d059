"""``executor-cost``: the executor's own client work an attempt, with the database taken away.

``inprocess`` measures the client's CPU an action with everything in it: psycopg, the server's
answers arriving, the claims. This scenario keeps only what the outbox itself adds around an
adapter: ``ActionExecutor.run`` (the lease timer, the fence, the result's finish, the
observers' hooks) over the real ``Store`` and its group-commit writers, whose statements are
answered in the process at once (after one suspension each, as an awaited statement is). Rounds
of 100 attempts are gathered, as an in-process claim round runs them, on the outbox's event loop
(``OUTBOX_EVENT_LOOP``).

Its peer is the floor any asyncio executor pays for the same shape: 100 tasks gathered, each
awaiting two writes that do nothing but suspend once. The two take turns, a batch of rounds at a
time, so that a busy moment of the machine lands on both alike; each reports the median of its
batches. ``actions_per_s`` is attempts a CPU second of the process (``cpu_us_per_attempt``, its
inverse); p50/p99 are a round's CPU ms; the ratio is the floor's CPU an attempt over the
outbox's.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from benchmarks.common import NOOP, Result, Scale, median, percentile
from outbox import event_loop
from outbox.action import created_action
from outbox.attempt import ActionAttempt
from outbox.config import Settings
from outbox.executor import ActionExecutor
from outbox.fence_token import FenceToken
from outbox.results import Abandoned, Done
from outbox.results import Result as ActionResult
from outbox.state import ActionState
from outbox.store import ClaimedAction, FenceRequest, Finished, FinishRequest, Store

#: Attempts a round (an in-process claim batch).
ROUND = 100
#: Rounds a batch; the two sides alternate batches.
ROUNDS_A_BATCH = 20


class AnsweredStore(Store):
    """A ``Store`` whose batched and single fences and finishes are answered at once: every
    token's fence passes and every finish is written (nothing handed on)."""

    async def _fence_many(self, fences: Sequence[FenceRequest]) -> dict[FenceToken, bool]:
        await asyncio.sleep(0)
        return dict.fromkeys((fence[0] for fence in fences), True)

    async def _fence_one(self, fence: FenceRequest) -> bool:
        await asyncio.sleep(0)
        return True

    async def _finish_many(self, finishes: Sequence[FinishRequest]) -> dict[FenceToken, Finished]:
        await asyncio.sleep(0)
        return {finish[0]: Finished() for finish in finishes}

    async def _finish_one(self, finish: FinishRequest) -> Finished | None:
        await asyncio.sleep(0)
        return Finished()


class FencedNoop:
    """Passes the fence, then reports the effect done (``inprocess``'s adapter, untimed)."""

    async def execute(self, attempt: ActionAttempt) -> ActionResult:
        if not await attempt.fence().begin_write():
            return Abandoned()
        return Done(ref="noop")


def claimed_round(first_id: int, lease: timedelta) -> list[ClaimedAction]:
    """``ROUND`` executing actions under a fresh lease, as a claim returns them."""
    now = datetime.now(UTC)
    actions = []
    for action_id in range(first_id, first_id + ROUND):
        action: Any = created_action(
            action_id, now, now, {"i": action_id}, NOOP.name, ActionState.EXECUTING, "w",
            f"lane-{action_id}", f"key-{action_id}", None, 5, None, 0, None,
        )  # fmt: skip
        object.__setattr__(action, "epoch", 1)
        object.__setattr__(action, "attempt", 1)
        object.__setattr__(action, "lease_until", now + lease)
        object.__setattr__(action, "created", False)
        actions.append(ClaimedAction(action, lease))
    return actions


async def _suspend() -> None:
    await asyncio.sleep(0)


async def floor_attempt() -> None:
    """The floor: a task that awaits a fence and a finish that only suspend."""
    await _suspend()
    await _suspend()


async def _batch(round_of: Callable[[], Awaitable[object]], rounds: int) -> list[float]:
    """CPU seconds of each of ``rounds`` rounds."""
    seconds = []
    for _ in range(rounds):
        started = time.process_time()
        await round_of()
        seconds.append(time.process_time() - started)
    return seconds


async def measure(batches: int) -> tuple[list[float], list[float], int]:
    """Each side's round CPU seconds over ``batches`` turns, and the attempts that ended."""
    settings = Settings()
    store = AnsweredStore(None, "executor_cost", settings.lease)  # type: ignore[arg-type]
    # The default observers (metrics, logs), as an outbox's executor has them.
    executor = ActionExecutor(store, {NOOP.name: FencedNoop()}, settings)
    claimed = claimed_round(1, settings.lease)
    ended = 0

    async def outbox_round() -> None:
        nonlocal ended
        at = time.monotonic()
        outcomes = await asyncio.gather(*(executor.run(c, at) for c in claimed))
        ended += sum(1 for outcome in outcomes if outcome.recorded)

    async def floor_round() -> None:
        await asyncio.gather(*(floor_attempt() for _ in range(ROUND)))

    ours: list[float] = []
    floor: list[float] = []
    await _batch(outbox_round, 2)  # warm: the first rounds import and build what they use
    await _batch(floor_round, 2)
    ended = 0
    for turn in range(batches):
        sides = ((ours, outbox_round), (floor, floor_round))
        for seconds, round_of in sides if turn % 2 == 0 else reversed(sides):
            seconds.extend(await _batch(round_of, ROUNDS_A_BATCH))
    return ours, floor, ended


def _us_an_attempt(rounds: list[float]) -> float:
    """The median over batches of a batch's CPU microseconds an attempt."""
    batches = [rounds[i : i + ROUNDS_A_BATCH] for i in range(0, len(rounds), ROUNDS_A_BATCH)]
    return median([sum(batch) / (len(batch) * ROUND) * 1e6 for batch in batches])


def _row(name: str, rounds: list[float], ratio: float, ratio_to: str) -> Result:
    per_attempt = _us_an_attempt(rounds)
    return Result(
        scenario=name,
        n=len(rounds) * ROUND,
        actions_per_s=round(1e6 / per_attempt, 1),
        p50_ms=round(percentile(rounds, 50) * 1000, 3),
        p99_ms=round(percentile(rounds, 99) * 1000, 3),
        ratio=round(ratio, 3),
        ratio_to=ratio_to,
        extra={
            "cpu_us_per_attempt": round(per_attempt, 2),
            "latency_is": f"one round's CPU ({ROUND} attempts gathered)",
        },
    )


def run(scale: Scale) -> list[Result]:
    batches = scale.n(10, 40, floor=2)
    ours, floor, ended = event_loop.run(measure(batches), Settings().event_loop)
    if ended != len(ours) * ROUND:
        raise RuntimeError(f"{ended} of {len(ours) * ROUND} attempts ended")
    ours_us, floor_us = _us_an_attempt(ours), _us_an_attempt(floor)
    return [
        _row("executor-cost", ours, floor_us / ours_us, "executor-cost-floor"),
        _row("executor-cost-floor", floor, 1.0, "executor-cost-floor"),
    ]
