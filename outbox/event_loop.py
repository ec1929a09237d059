"""The event loop of the outbox's own processes: the claimer, a worker process's loop thread,
``outbox.testing.drain`` and the demo. uvloop where it is installed (a dependency on Linux and
macOS), as uvicorn's ``--loop auto`` picks it, else asyncio's own loop; ``OUTBOX_EVENT_LOOP``
(``auto``, ``uvloop``, ``asyncio``) chooses.

uvloop runs the loop's own work (ready callbacks, timers, socket readiness) in C. An attempt
crosses the loop a dozen times (its task, the group-commit futures of its fence and its finish,
the lease's timeout, psycopg's waits on the socket), and the in-process executor spent about a
fifth less CPU an action on uvloop (0.103-0.116 -> 0.086-0.093 ms, the same run's rounds).
Nothing of the outbox depends on which loop runs it: uvloop's clock ticks in milliseconds, and
every deadline the outbox keeps on the loop is seconds long.

An application's own loop is the application's: ``Outbox.run_until_idle`` and the rest of the
async API run on whatever loop calls them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from outbox.errors import ConfigurationError

T = TypeVar("T")

#: The choices of ``OUTBOX_EVENT_LOOP``.
EVENT_LOOPS = ("auto", "uvloop", "asyncio")


def loop_factory(choice: str = "auto") -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes a new loop of ``choice``: uvloop's for ``uvloop`` (an error if it is not
    installed) and for ``auto`` where it is installed, asyncio's otherwise."""
    if choice not in EVENT_LOOPS:
        raise ConfigurationError(
            f"OUTBOX_EVENT_LOOP: {choice!r} is not one of {', '.join(EVENT_LOOPS)}"
        )
    if choice == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError:
        if choice == "uvloop":
            raise ConfigurationError(
                "OUTBOX_EVENT_LOOP=uvloop, but uvloop is not installed (pip install uvloop)"
            ) from None
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def loop_name(loop: asyncio.AbstractEventLoop) -> str:
    """``uvloop`` or ``asyncio``: which loop a process runs, for its start-up log line."""
    return "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio"


def run(main: Coroutine[Any, Any, T], choice: str = "auto") -> T:
    """``asyncio.run(main)`` on a new loop of ``choice``."""
    with asyncio.Runner(loop_factory=loop_factory(choice)) as runner:
        return runner.run(main)
