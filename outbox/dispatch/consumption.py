"""Whether the workers consume what a claimer pushes, per kind.

A claim whose lease ran out before any worker took its message is *unconsumed*: the worker
pool is down or stuck, or the broker lost the message. Reclaiming it costs no attempt (a take
counts one), but claiming on would only fill the broker with messages nobody reads and keep the
pool's backlog a lease behind. So while a kind has unconsumed claims, the claimer claims none
of its lane heads and re-pushes one unconsumed claim at a time, the *probe*. Once a worker takes
the probe (or the probe is over: ended, erased, reclaimed by another claimer), the kind is
consumed again: the claimer reclaims everything that waited and claims as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from outbox import metrics
from outbox.fence_token import FenceToken

log = logging.getLogger("outbox.claimer")


@dataclass
class ConsumptionWatch:
    """One claimer's view: the probe it has out for each kind whose claims went unconsumed."""

    probes: dict[str, FenceToken | None] = field(default_factory=dict)

    def stalled(self, kind: str) -> bool:
        return kind in self.probes

    def probe(self, kind: str) -> FenceToken | None:
        """The claim of the kind's outstanding probe, if one went out."""
        return self.probes.get(kind)

    def stall(self, kind: str, unconsumed: int) -> None:
        """The kind has claims no worker took within a lease: claiming stops."""
        if kind in self.probes:
            return
        self.probes[kind] = None
        metrics.set_claiming_stalled(kind, True)
        log.warning(
            "kind %s: %s claims were not taken by any worker within their lease; claiming "
            "stops and one probe at a time is pushed until a worker takes it",
            kind,
            unconsumed,
            extra={"event": "claiming_stalled", "kind": kind, "unconsumed": unconsumed},
        )

    def probed(self, kind: str, token: FenceToken) -> None:
        self.probes[kind] = token

    def resume(self, kind: str) -> None:
        """A worker took the probe: the kind's claims are consumed again."""
        self.probes.pop(kind, None)
        metrics.set_claiming_stalled(kind, False)
        log.info(
            "kind %s: workers take messages again; claiming resumes",
            kind,
            extra={"event": "claiming_resumed", "kind": kind},
        )
