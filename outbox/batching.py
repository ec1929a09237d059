"""Group commit: many concurrent single-row writes of one sort, sent as one statement.

Each attempt in a process fences, finishes (and, under Dramatiq, takes its message) with a
one-row UPDATE in a transaction of its own: three commits an action, each a round trip and a
WAL flush. A ``GroupWriter`` lets every caller that arrives while a statement of its sort is in
flight join the next one, so N concurrent attempts pay a few commits instead of N. A caller alone
goes at once: batching adds no wait when there is nothing to batch with.

Guarantees, the same as the single-row statement's:

- every row keeps its own check (its epoch, its state, its lease margin): the batched statement
  is the single one over ``unnest`` of the callers' parameters, and each caller gets back only
  the row of its own key, or nothing;
- a key that appears twice in one batch (two deliveries of one message) is given to the first
  caller only, as the second single-row statement would have found it taken;
- a batch that fails as a whole (a deadlock with an application transaction that holds lane
  rows in another order, or one caller's parameters the statement refuses, such as an id out of
  bigint range) is re-run one caller at a time with the single-row statement, so one caller's
  failure is never another's.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Hashable, MutableMapping, Sequence
from typing import Generic, TypeVar

import psycopg

log = logging.getLogger("outbox.batching")

#: Most callers in one statement: big enough to cover a claim batch, small enough that one
#: statement's locks and its trigger work stay short.
MAX_BATCH = 256
#: Statements of one sort in flight at once: a caller that arrives while one runs joins the next,
#: which starts when it ends, so a caller waits at most about one statement's time for its turn.
#: One, not two: a second statement started while the first commits split the callers into
#: smaller batches, and each statement has a fixed cost (its plan, its trigger call, its commit):
#: end to end through Dramatiq, two cost about 11-14% more CPU an action (workers and PostgreSQL)
#: than one, for no gain in latency.
MAX_IN_FLIGHT = 1

P = TypeVar("P")
K = TypeVar("K", bound=Hashable)
R = TypeVar("R")


class _Waiting(Generic[P, R]):
    """One caller: its parameters, and the future its result comes in."""

    __slots__ = ("future", "params")

    def __init__(self, params: P, future: asyncio.Future[R | None]) -> None:
        self.params = params
        self.future = future


class GroupWriter(Generic[P, K, R]):
    """Coalesces concurrent calls on one event loop.

    ``many(params_list)`` runs one statement for all and returns ``{key: result}`` for the
    rows it changed (a mapping of its own: the callers take their rows out of it);
    ``one(params)`` is the single-row fallback; ``key(params)`` names the row (the outbox's
    writers key by ``FenceToken``).
    """

    def __init__(
        self,
        name: str,
        many: Callable[[Sequence[P]], Awaitable[MutableMapping[K, R]]],
        one: Callable[[P], Awaitable[R | None]],
        key: Callable[[P], K],
    ) -> None:
        self.name = name
        self._many = many
        self._one = one
        self._key = key
        self._queue: list[_Waiting[P, R]] = []
        self._in_flight = 0
        self._tasks: set[asyncio.Future[None]] = set()
        #: Statements and callers so far (for benchmarks and tests).
        self.statements = 0
        self.calls = 0

    async def __call__(self, params: P) -> R | None:
        waiting: _Waiting[P, R] = _Waiting(params, asyncio.get_running_loop().create_future())
        self._queue.append(waiting)
        self.calls += 1
        if self._in_flight < MAX_IN_FLIGHT:
            self._in_flight += 1
            # A task of its own, so a caller that is cancelled never strands the others.
            task = asyncio.ensure_future(self._flush())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # Awaited directly, not shielded: a cancelled caller's future is cancelled alone, and
        # the batch skips it (``future.done()``), so the others are never stranded.
        return await waiting.future

    async def _flush(self) -> None:
        try:
            while self._queue:
                batch, self._queue = self._queue[:MAX_BATCH], self._queue[MAX_BATCH:]
                self.statements += 1
                await self._run(batch)
        finally:
            self._in_flight -= 1

    async def _run(self, batch: list[_Waiting[P, R]]) -> None:
        if len(batch) == 1:
            await self._run_one(batch[0])
            return
        try:
            found = await self._many([w.params for w in batch])
        except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure):
            log.info("%s: a batch of %s hit a deadlock; one at a time", self.name, len(batch))
            await self._run_each(batch)
            return
        except Exception as error:
            # Whose row failed is unknown: each caller runs alone, so only that one fails.
            log.warning(
                "%s: a batch of %s failed (%s); one at a time",
                self.name,
                len(batch),
                type(error).__name__,
            )
            await self._run_each(batch)
            return
        except BaseException as error:
            for waiting in batch:
                if not waiting.future.done():
                    waiting.future.set_exception(error)
            raise
        for waiting in batch:
            # The first caller of a key takes its row; a twin finds it taken, as it would have.
            result = found.pop(self._key(waiting.params), None)
            if not waiting.future.done():
                waiting.future.set_result(result)

    async def _run_each(self, batch: list[_Waiting[P, R]]) -> None:
        for waiting in batch:
            if not waiting.future.done():
                await self._run_one(waiting)

    async def _run_one(self, waiting: _Waiting[P, R]) -> None:
        try:
            result = await self._one(waiting.params)
        except BaseException as error:
            if not waiting.future.done():
                waiting.future.set_exception(error)
            if not isinstance(error, Exception):
                raise
            return
        if not waiting.future.done():
            waiting.future.set_result(result)
