"""One event loop thread and one connection pool per worker process.

Dramatiq runs actors on worker threads; the outbox's executor is async. Each worker process
gets one loop thread and one ``Store`` (autocommit pool) on it, started on first use in that
process (so a fork never inherits a parent's pool), and every message's coroutine runs there.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from contextlib import AsyncExitStack
from typing import TYPE_CHECKING

from dramatiq.asyncio import EventLoopThread

from outbox import metrics
from outbox.executor import ActionExecutor, Outcome

if TYPE_CHECKING:
    from outbox.outbox import Outbox

log = logging.getLogger("outbox.dispatch")

#: How long starting the loop thread and opening the pool may take before a worker gives up.
START_TIMEOUT = 30.0


class WorkerRuntime:
    """Runs ``(action_id, epoch)`` messages through the core ``ActionExecutor``.

    Guarantees: a message runs the adapter only if its epoch still holds and no other delivery
    of that epoch took it first (``Store.take_attempt``); any other message is dropped, logged
    and counted as an ``abandoned`` attempt. The attempt's deadline is its lease by the database
    clock, measured from before the take, so the executor ends it before the lease does.
    """

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._thread: EventLoopThread | None = None
        self._stack: AsyncExitStack | None = None
        self._executor: ActionExecutor | None = None
        #: Messages this process dropped because their epoch was stale or already taken.
        self.abandoned = 0

    def start(self) -> None:
        """Starts the loop thread and opens the pool, once per process."""
        with self._lock:
            if self._pid == os.getpid():
                return
            thread = EventLoopThread(log)
            thread.daemon = True
            thread.start(timeout=START_TIMEOUT)
            future = asyncio.run_coroutine_threadsafe(self._open(), thread.loop)
            future.result(timeout=START_TIMEOUT)
            self._thread = thread
            self._pid = os.getpid()
            log.info("outbox worker runtime started in process %s", self._pid)

    async def _open(self) -> None:
        stack = AsyncExitStack()
        store = await stack.enter_async_context(self.outbox.store())
        self._stack = stack
        self._executor = self.outbox.executor(store)

    def stop(self) -> None:
        """Closes the pool and stops the loop thread (after the worker finished its messages)."""
        with self._lock:
            thread, stack = self._thread, self._stack
            if thread is None or self._pid != os.getpid():
                return
            if stack is not None:
                future = asyncio.run_coroutine_threadsafe(stack.aclose(), thread.loop)
                future.result(timeout=START_TIMEOUT)
            thread.stop()
            self._thread = self._stack = self._executor = None
            self._pid = None

    def run(self, kind: str, action_id: int, epoch: int) -> Outcome | None:
        """Runs one message on this process's loop; None when it was dropped as Abandoned.

        A Dramatiq time limit (or shutdown) interrupting the calling thread cancels the attempt.
        """
        self.start()
        assert self._thread is not None
        return self._thread.run_coroutine(self._run(kind, action_id, epoch))

    async def _run(self, kind: str, action_id: int, epoch: int) -> Outcome | None:
        executor = self._executor
        assert executor is not None
        # Taken before the statement, so the local deadline never outlives the database lease.
        started = time.monotonic()
        claimed = await executor.store.take_attempt(action_id, epoch)
        if claimed is None:
            self.abandoned += 1
            metrics.record_attempt(kind, "abandoned", False)
            log.info(
                "abandoned message for action %s epoch %s (kind %s): the epoch moved, "
                "the action ended, or another delivery took it",
                action_id,
                epoch,
                kind,
            )
            return None
        return await executor.run(claimed, started)
