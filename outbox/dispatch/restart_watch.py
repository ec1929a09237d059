"""Whether the broker restarted since the claimer last looked, and so lost what it held.

A Redis broker without persistence (or with snapshots older than its last writes) comes back
from a restart empty: every message queued for the workers, and every unacknowledged one a
consumer had fetched, is gone. Their claims are EXECUTING, untaken, and would wait for their
lease (minutes) before the claimer's consumption watch noticed them, and then a probe at a time
(``outbox.dispatch.consumption``). A Redis server names each of its runs (``run_id``, new at
every start), so the claimer reads it every ``CHECK_EVERY`` seconds and whenever the broker
answers again after a failed push: a run it has not seen before means a restart, and the
claimer gives back at once every claim of its kinds that no worker has taken
(``release_untaken_claims``). The claim that follows pushes them again under a new epoch.

Giving back is safe whatever the broker kept: a claim a worker has taken, or whose write
started, is never given back, and a message that survived the restart carries an epoch the
take then refuses. It costs a claim pushed since the restart a second message.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from outbox.connecting import one_line
from outbox.dispatch.pushing import OffLoop

log = logging.getLogger("outbox.claimer")

#: Seconds between two looks at the broker's run (one ``INFO server`` round trip).
CHECK_EVERY = 1.0


class RestartWatch:
    """The run of the broker last seen; ``identity`` is the fabric's ``broker_identity``
    (blocking: run on ``off_loop``)."""

    def __init__(
        self,
        identity: Callable[[], str | None],
        off_loop: OffLoop,
        every: float = CHECK_EVERY,
    ) -> None:
        self.identity = identity
        self.off_loop = off_loop
        self.every = every
        self.known: str | None = None
        self._next_look = 0.0
        self._failing = False

    async def restarted(self, *, now: bool = False) -> bool:
        """Whether the broker runs anew since the last look; looks once ``every`` seconds
        passed, or at once with ``now``. The first run seen is no restart; nor is a broker that
        cannot say (the broker gate deals with one that does not answer)."""
        if not now and time.monotonic() < self._next_look:
            return False
        self._next_look = time.monotonic() + self.every
        try:
            identity = await self.off_loop.run(self.identity)
        except Exception as error:
            if not self._failing:
                log.warning("could not read which run of the broker answers (%s)", one_line(error))
            self._failing = True
            return False
        self._failing = False
        if identity is None:
            return False
        known, self.known = self.known, identity
        return known is not None and identity != known
