"""Overlapping in-process rounds: several claim-and-run loops on one executor until idle.

A round (``Outbox.claim_and_run``) claims, then runs what it claimed: its statements come one
after the other (the claim, then the fences, then the finishes), so a single loop leaves the
database and the process waiting on each other most of the time. With ``concurrency`` loops, one
claims while others fence and finish; their fences and finishes join the same group-commit
statements (``outbox.batching``). The claims take turns, one at a time, unless the caller says
they may overlap (``claims_overlap``): a claim locks lane rows as its scan finds them and skips
those another claim holds, so claims at once take different lanes; only a count that a claim
reads and the others' uncommitted claims change (a concurrency cap, of a kind or of a key)
needs them in turn.

Idle, as for a single loop: a claim found nothing while no other round was claiming or running,
and nothing was claimed or finished since it started (a finish may make a lane's next action
due). A claim that found nothing after another claim took something meanwhile (two claims at
once skip each other's lane heads) claims again at once; one that found nothing while others
still claim or run waits until one of them claims or finishes something.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

C = TypeVar("C")
T = TypeVar("T")


async def run_until_idle(
    claim: Callable[[], Awaitable[C]],
    run: Callable[[C], Awaitable[Sequence[T]]],
    on_round: Callable[[Sequence[T]], None],
    concurrency: int = 1,
    claimed: Callable[[C], bool] = bool,
    claims_overlap: bool = False,
) -> None:
    """Runs rounds of ``claim()`` then ``run(what it claimed)`` in ``concurrency`` overlapping
    loops until idle; ``on_round`` hears of every round that ran something, as it ends;
    ``claimed`` tells whether a claim took anything; ``claims_overlap``: claims need not take
    turns. An exception from any of them ends every loop (their rounds are cancelled: what they
    claimed is left to its lease) and is raised."""
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    state = _Rounds(claims_overlap)

    async def loop() -> None:
        while not state.idle:
            seen = state.changes
            state.busy += 1
            try:
                async with state.claiming:
                    took = await claim()
                if claimed(took):
                    state.change()
                    done = await run(took)
            finally:
                state.busy -= 1
            if claimed(took):
                state.change()
                on_round(done)
            elif state.changes != seen:
                continue  # something was claimed or finished meanwhile: look again at once
            elif state.busy == 0:
                state.idle = True
                state.change()
            else:
                await state.wait_for_change()

    tasks = [asyncio.ensure_future(loop()) for _ in range(concurrency)]
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        # Each cancelled round ends (and gives back its connection) before this returns.
        await asyncio.gather(*tasks, return_exceptions=True)


class _Rounds:
    """What the loops share: rounds claiming or running now, how often something was claimed
    or finished, and whether they are idle."""

    def __init__(self, claims_overlap: bool) -> None:
        self.busy = 0
        self.changes = 0
        self.idle = False
        #: One claim at a time, unless claims may overlap.
        self.claiming: contextlib.AbstractAsyncContextManager[object] = (
            contextlib.nullcontext() if claims_overlap else asyncio.Lock()
        )
        self._change = asyncio.Event()

    def change(self) -> None:
        self.changes += 1
        self._change.set()
        self._change = asyncio.Event()

    async def wait_for_change(self) -> None:
        await self._change.wait()
