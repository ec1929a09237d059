"""Whether the workers consume what a claimer pushes, per kind.

A claim whose lease ran out before any worker took its message is *unconsumed*: the worker
pool is down or stuck, or the broker lost the message. Reclaiming it costs no attempt (a take
counts one), but claiming on would only fill the broker with messages nobody reads and keep the
pool's backlog a lease behind. So while a kind has unconsumed claims, the claimer claims none
of its lane heads and re-pushes one unconsumed claim at a time, the *probe*. Once a worker takes
the probe (or the probe is over: ended, erased, reclaimed by another claimer), the kind is
consumed again: the claimer reclaims everything that waited and claims again.

Workers that took the probe are alive; that claims still waited a whole lease for them means
they were that far behind (a slow provider, an overloaded machine, a prefetch buffer deeper
than a lease's work). Claiming as much as before would put them behind again, and the kind
would flap between stalled and resumed at a probe's pace. So a resumed kind claims under an
*adaptive bound*: half of what it had in flight when it stalled, grown by an eighth each round
in which it reached the bound with nothing unconsumed, back to the configured ``in_flight``
(additive increase, multiplicative decrease, as TCP meets a congested link).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from outbox import metrics
from outbox.fence_token import FenceToken

log = logging.getLogger("outbox.claimer")


#: The adaptive bound never falls below this many claims in flight.
MIN_BOUND = 1
#: A round that reached the adaptive bound with nothing unconsumed raises it by this fraction.
GROWTH = 8


@dataclass
class ConsumptionWatch:
    """One claimer's view: the probe it has out for each kind whose claims went unconsumed,
    and the adaptive bound of each kind whose workers fell a lease behind."""

    probes: dict[str, FenceToken | None] = field(default_factory=dict)
    #: Per kind, claims in flight (live or unconsumed) when it stalled.
    in_flight_at_stall: dict[str, int] = field(default_factory=dict)
    #: Per kind, the in-flight bound below the configured one after a stall (none: configured).
    bounds: dict[str, int] = field(default_factory=dict)

    def stalled(self, kind: str) -> bool:
        return kind in self.probes

    def probe(self, kind: str) -> FenceToken | None:
        """The claim of the kind's outstanding probe, if one went out."""
        return self.probes.get(kind)

    def bound(self, kind: str, configured: int) -> int:
        """The kind's in-flight bound now: the configured one, or lower after a stall."""
        return min(configured, self.bounds.get(kind, configured))

    def stall(self, kind: str, unconsumed: int, in_flight: int = 0) -> None:
        """The kind has claims no worker took within a lease: claiming stops. ``in_flight``:
        its claims with a live lease or none taken, the depth the workers could not keep up
        with."""
        if kind in self.probes:
            return
        self.probes[kind] = None
        self.in_flight_at_stall[kind] = in_flight
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

    def resume(self, kind: str, configured: int) -> None:
        """A worker took the probe: the kind's claims are consumed again, under half the depth
        its workers fell behind on."""
        self.probes.pop(kind, None)
        depth = self.in_flight_at_stall.pop(kind, 0)
        bound = max(MIN_BOUND, min(self.bound(kind, configured), depth) // 2)
        if bound < configured:
            self.bounds[kind] = bound
        now = self.bound(kind, configured)
        metrics.set_claiming_stalled(kind, False)
        metrics.set_in_flight_bound(kind, now)
        log.info(
            "kind %s: workers take messages again; claiming resumes with at most %s in flight "
            "(of %s), more as the workers keep up",
            kind,
            now,
            configured,
            extra={"event": "claiming_resumed", "kind": kind, "bound": now},
        )

    def kept_up(self, kind: str, configured: int, in_flight: int) -> None:
        """A round found nothing of the kind unconsumed, with ``in_flight`` claims out: an
        adaptive bound that held claims back grows by an eighth, until it is the configured
        one again."""
        bound = self.bounds.get(kind)
        if bound is None or in_flight < bound:
            return
        grown = bound + max(1, bound // GROWTH)
        if grown >= configured:
            del self.bounds[kind]
            grown = configured
        else:
            self.bounds[kind] = grown
        metrics.set_in_flight_bound(kind, grown)
