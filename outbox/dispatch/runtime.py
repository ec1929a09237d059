"""One event loop thread and one connection pool per worker process.

Dramatiq and Celery run messages on worker threads (or a prefork child's main thread); the
outbox's executor is async. Each worker process
gets one loop thread and one ``Store`` (autocommit pool) on it, started on first use in that
process (so a fork never inherits a parent's pool), and every message's coroutine runs there.

The pool opens in the background: a worker whose PostgreSQL is down at start still boots (so
Dramatiq's SIGTERM handling works), logs each wait for the server in one line, and its messages
wait for the pool; a stop ends the wait at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from dramatiq.asyncio import EventLoopThread

from outbox import event_loop
from outbox.connecting import wait_for_database
from outbox.dispatch.heartbeat import Heartbeat
from outbox.executor import ActionExecutor, Outcome
from outbox.fence_token import FenceToken
from outbox.loop_lag import start_watching
from outbox.outage import OUTAGE, sent_again

if TYPE_CHECKING:
    from outbox.outbox import Outbox

log = logging.getLogger("outbox.dispatch")

T = TypeVar("T")

#: How often a thread waiting for its attempt looks for an Interrupt (as dramatiq's own).
INTERRUPT_CHECK = 0.1
#: How long starting the loop thread (and closing the pool at stop) may take before a worker
#: gives up. Opening the pool waits for PostgreSQL as long as it takes (each wait logged).
START_TIMEOUT = 30.0
#: How long past an attempt's lease a fabric's time limit cancels its message (Dramatiq's
#: ``time_limit``, Celery's ``soft_time_limit``): the executor ends every attempt at its lease
#: itself, finish written; the fabric's limit only frees a thread whose attempt outstayed it,
#: and comes this much later so that a loop running the executor's timeouts late (an overloaded
#: process) never sees an attempt cut off past its fence while its own lease holds.
TIME_LIMIT_GRACE = timedelta(seconds=10)
#: Seconds of a message's time limit (the lease, from the message's start) a handed-on
#: attempt's lease leaves unused: the fabric starts its clock a little before ``_run`` does.
HAND_OFF_SLACK = 1.0


#: When the fabric began the message this thread runs (``mark_delivery``), if it said.
_delivery = threading.local()


def mark_delivery() -> None:
    """The fabric begins a message in this thread: its time limit runs from now (a Dramatiq
    middleware calls this before ``TimeLimit`` starts its clock, ``DeliveryClock``)."""
    _delivery.at = time.monotonic()


def _delivered_at() -> float:
    """When the message this thread runs began (``mark_delivery``), taken once; now when the
    fabric did not say."""
    at: float | None = getattr(_delivery, "at", None)
    _delivery.at = None
    now = time.monotonic()
    return now if at is None else min(at, now)


class _LoopThread(EventLoopThread):
    """Dramatiq's loop thread on the outbox's event loop (``OUTBOX_EVENT_LOOP``)."""

    def __init__(self, choice: str) -> None:
        super().__init__(log)
        # Dramatiq made an asyncio loop that never ran: closed, and replaced before the start.
        self.loop.close()
        self.loop = event_loop.loop_factory(choice)()


class WorkerRuntime:
    """Runs the ``FenceToken``s of messages through the core ``ActionExecutor``.

    Guarantees: a message runs the adapter only if its epoch still holds and no other delivery
    of that epoch took it first (``Store.take_attempt``); any other message is dropped and
    reported to the executor's observers (logged, and counted as an ``abandoned`` attempt).
    The attempt's deadline is its lease by the database clock, measured from before the take,
    so the executor ends it before the lease does.
    """

    def __init__(self, outbox: Outbox) -> None:
        self.outbox = outbox
        self._lock = threading.Lock()
        self._pid: int | None = None
        self._thread: EventLoopThread | None = None
        self._stack: AsyncExitStack | None = None
        self._executor: ActionExecutor | None = None
        self._opening: concurrent.futures.Future[None] | None = None
        self._stopping: asyncio.Event | None = None
        self._heartbeat: asyncio.Future[None] | None = None
        #: Attempts running now in this process (the heartbeat's in-flight count).
        self._running = 0
        #: Set when the worker begins to stop: its messages end without handing lanes on.
        self._draining = False

    def start(self) -> None:
        """Starts the loop thread and opens the pool, once per process."""
        with self._lock:
            if self._pid == os.getpid():
                return
            self._draining = False
            thread = _LoopThread(self.outbox.settings.event_loop)
            thread.daemon = True
            thread.start(timeout=START_TIMEOUT)
            self._stopping = asyncio.Event()
            self._opening = asyncio.run_coroutine_threadsafe(self._open(), thread.loop)
            self._thread = thread
            self._pid = os.getpid()
            log.info(
                "outbox worker runtime started in process %s (%s)",
                self._pid,
                event_loop.loop_name(thread.loop),
            )

    def wait_ready(self, timeout: float | None = None) -> None:
        """Starts the runtime (``start``) and blocks until its pool is open; raises
        ``TimeoutError`` after ``timeout`` seconds (PostgreSQL still not answering)."""
        self.start()
        assert self._opening is not None
        self._opening.result(timeout=timeout)

    async def _open(self) -> None:
        """Waits for PostgreSQL (with backoff, each wait logged), then opens the pool."""
        assert self._stopping is not None
        url = self.outbox.settings.require_database_url()
        while not self._stopping.is_set():
            if not await wait_for_database(url, log, self._stopping):
                break
            stack = AsyncExitStack()
            try:
                # A worker's pool runs attempts' statements: planned once a connection.
                store = await stack.enter_async_context(self.outbox.store(generic_plans=True))
            except Exception as error:  # the server went away again meanwhile
                log.warning("opening the outbox pool failed (%s); waiting again", error)
                continue
            self._stack = stack
            self._executor = self.outbox.executor(store)
            settings = self.outbox.settings
            beat = Heartbeat(
                store,
                "worker",
                self.outbox.adapters,
                lambda: self._running,
                settings.heartbeat_interval.total_seconds(),
            )
            # Each take names this process, and its row exists before the first take does: a
            # claimer gives back the unfenced attempts of a worker whose heartbeat stopped
            # (outbox.maintenance.lost_workers), never those of one it has no row of.
            store.taker = beat.process_id
            await beat.beat()
            self._heartbeat = asyncio.ensure_future(beat.run(self._stopping))
            # How late this loop runs the attempts' cuts (outbox_event_loop_lag_seconds).
            stack.callback(start_watching("worker").cancel)
            return
        raise RuntimeError("the worker runtime stopped before PostgreSQL answered")

    async def _ready(self) -> ActionExecutor:
        """The executor, once the pool is open (waiting for it while PostgreSQL is down)."""
        opening = self._opening
        assert opening is not None
        if not opening.done():
            await asyncio.wrap_future(opening)
        opening.result()
        assert self._executor is not None
        return self._executor

    def stop(self) -> None:
        """Closes the pool and stops the loop thread (after the worker finished its messages)."""
        with self._lock:
            thread = self._thread
            if thread is None or self._pid != os.getpid():
                return
            stopping, opening = self._stopping, self._opening
            if stopping is not None:
                thread.loop.call_soon_threadsafe(stopping.set)
            if opening is not None:
                # Stopped while waiting for PostgreSQL: nothing was opened.
                with contextlib.suppress(Exception):
                    opening.result(timeout=START_TIMEOUT)
            stack = self._stack
            if stack is not None:
                if self._heartbeat is not None:
                    # Ended by the stop event; its last act (removing the row) needs the pool.
                    with contextlib.suppress(Exception):
                        asyncio.run_coroutine_threadsafe(
                            _awaited(self._heartbeat), thread.loop
                        ).result(timeout=START_TIMEOUT)
                future = asyncio.run_coroutine_threadsafe(stack.aclose(), thread.loop)
                future.result(timeout=START_TIMEOUT)
            thread.stop()
            self._thread = self._stack = self._executor = None
            self._opening = self._stopping = None
            self._heartbeat = None
            self._pid = None

    def run(self, kind: str, token: FenceToken) -> Outcome | None:
        """Runs one message on this process's loop; None when it was dropped as Abandoned.

        A Dramatiq time limit (or shutdown), or a Celery soft time limit, interrupting the calling
        thread cancels the attempt.
        """
        started = _delivered_at()  # the fabric's time limit runs from then, see ``_run``
        self.start()
        assert self._thread is not None
        return run_on_loop(self._thread.loop, lambda: self._run(kind, token, started))

    def run_many(self, kind: str, tokens: Sequence[FenceToken]) -> list[Outcome | None]:
        """Runs the tokens of one message concurrently on this process's loop (their takes,
        fences and finishes share group-commit statements); each is taken, run and finished on
        its own, exactly as a message of its own would be.

        Every attempt ends before this returns; if any raised (a database error: the action is
        then left to its lease), the first error is raised after the rest ended, so Dramatiq
        logs the message as failed. An Interrupt cancels them all.
        """
        started = _delivered_at()  # the fabric's time limit runs from then, see ``_run``
        self.start()
        assert self._thread is not None
        outcomes = run_on_loop(self._thread.loop, lambda: self._run_all(kind, tokens, started))
        finished: list[Outcome | None] = []
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
            finished.append(outcome)
        return finished

    async def _run_all(
        self, kind: str, tokens: Sequence[FenceToken], started: float
    ) -> list[Outcome | BaseException | None]:
        return await asyncio.gather(
            *(self._run(kind, token, started) for token in tokens), return_exceptions=True
        )

    async def _run(self, kind: str, token: FenceToken, started: float) -> Outcome | None:
        """Takes and runs one message's attempt, then the lane's next actions its finishes
        handed on (``hand_off``); returns the message's own attempt's outcome.

        ``started``: ``time.monotonic()`` when the fabric began the message (``mark_delivery``,
        else when it handed the message over, in its thread). The fabric's time limit (the
        lease) runs from then, not from when this loop got round to the message, which a busy
        loop, a pool still opening after a database restart, or a thread kept waiting in an
        overloaded process, may put seconds later: the attempt's
        deadline and what a hand-off may lease are measured from it, so neither outlives the
        time limit, which would cancel an attempt past its fence while its own lease still held
        (an email then ends UNCERTAIN). It is also before the take, so the local deadline never
        outlives the database lease."""
        executor = self._executor or await self._ready()
        if self._too_late_to_take(started):
            # It waited here (for the pool, PostgreSQL being down as the process began, or for
            # a busy loop) until its time limit leaves no attempt room to pass its fence: a take
            # would spend an attempt on nothing. The claim's lease, which began before the
            # push, is about out as well.
            log.warning(
                "message for action %s epoch %s (kind %s) began %.1fs ago and waited in this "
                "worker: too little of its time left for an attempt, so it is not taken "
                "(no attempt spent); the action is claimed again when its lease runs out",
                token.action_id,
                token.epoch,
                kind,
                time.monotonic() - started,
            )
            return None
        self._running += 1
        try:
            try:
                claimed = await executor.store.take_attempt(token)
            except OUTAGE as error:
                # As long as the attempt could still pass its fence (``_too_late_to_take``).
                claimed = await sent_again(
                    lambda: executor.store.take_attempt(token),
                    error,
                    until=started + self.outbox.settings.lease.total_seconds() - self._margin(),
                    what="take",
                    token=token,
                )
            if claimed is None:
                executor.observers.take_refused(kind, token)
                return None
            outcome = await executor.run(claimed, started, hand_off=self.hand_off(started, 0))
            handed, step = 0, outcome
            while step.next is not None:
                handed += 1
                step = await executor.run(
                    step.next, step.next_claimed_at, hand_off=self.hand_off(started, handed)
                )
            return outcome
        finally:
            self._running -= 1

    def _too_late_to_take(self, started: float) -> bool:
        """Whether a message that began at ``started`` has less than the write margin of its
        time (the lease) left: its attempt's deadline would come before it could pass its
        fence, which needs that margin."""
        return self._time_left(started) < self._margin()

    def _margin(self) -> float:
        return self.outbox.settings.write_margin.total_seconds()

    def _time_left(self, started: float) -> float:
        """Seconds left of the time limit (the lease) of a message that began at ``started``."""
        return self.outbox.settings.lease.total_seconds() - (time.monotonic() - started)

    def stop_handing_off(self) -> None:
        """The worker begins to stop (it waits for the messages it runs): every attempt from now
        on ends without handing its lane on, so the stop waits for one attempt a message."""
        self._draining = True

    def hand_off(self, started: float, handed: int) -> timedelta | None:
        """The lease of a lane's next action this message may still run (the lane hand-off),
        or None. At most ``hand_off`` actions a message, and only while the message's time
        limit (the lease, from ``started``) leaves a lease of at least half the full one, and
        twice the write margin, to the next: every attempt ends before the fabric's time limit
        would cut it off. None once the worker began to stop (``stop_handing_off``)."""
        settings = self.outbox.settings
        if handed >= settings.hand_off or self._draining:
            return None
        lease = settings.lease.total_seconds()
        left = self._time_left(started) - HAND_OFF_SLACK
        if left < max(lease / 2, 2 * settings.write_margin.total_seconds()):
            return None
        return timedelta(seconds=left)


async def _awaited(future: asyncio.Future[None]) -> None:
    await future


def run_on_loop(loop: asyncio.AbstractEventLoop, make: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Runs ``make()`` as a task on ``loop`` (another thread's) and blocks until it ends.

    Dramatiq's ``EventLoopThread.run_coroutine``, with a bare lock as the hand-back instead of a
    concurrent Future, its Condition and an Event a message: every wake of a waiting thread
    costs the loop thread the GIL, a cost a busy worker pays on every message. As there, an
    exception raised in the waiting thread (Dramatiq's ``Interrupt`` at a time limit or
    shutdown, Celery's ``SoftTimeLimitExceeded``) cancels the task, and the thread re-raises it
    once the task's cancellation cleanup ended.
    """
    finished = threading.Lock()
    finished.acquire()
    started: list[asyncio.Task[T]] = []

    def begin() -> None:
        task = loop.create_task(make())
        task.add_done_callback(lambda _: finished.release())
        started.append(task)

    def cancel() -> None:
        # Loop callbacks run in order, so begin() ran already if it was scheduled at all.
        if started:
            started[0].cancel()
        else:
            finished.release()

    try:
        loop.call_soon_threadsafe(begin)
        # A timeout, so an Interrupt raised in this thread is seen while it waits.
        while not finished.acquire(timeout=INTERRUPT_CHECK):
            pass
    except BaseException:  # raised asynchronously in this thread by the fabric
        loop.call_soon_threadsafe(cancel)
        if not finished.acquire(timeout=START_TIMEOUT):
            log.error("a cancelled attempt did not end within %ss", START_TIMEOUT)
        raise
    return started[0].result()
