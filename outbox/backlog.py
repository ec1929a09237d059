"""The backlog as an operator sees it, per kind: due actions, the oldest one's age, actions in
flight, claims no worker took within their lease, and lanes blocked behind a retrying head.
Read by ``outbox status`` and the metrics gauges; every number comes from the database and its
clock."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from outbox._io import Operation, Statement
from outbox.kinds import ActionKind
from outbox.queries import queries_for


@dataclass(frozen=True, slots=True)
class KindBacklog:
    """One kind's backlog. ``oldest_due_age`` is in seconds (0 when nothing is due)."""

    kind: str
    due: int = 0
    oldest_due_age: float = 0.0
    in_flight: int = 0
    blocked_lanes: int = 0
    #: Claims whose lease ran out before any worker took their message.
    unconsumed: int = 0
    #: Distinct actions whose attempts answered ``Retry`` since the kind's last DONE (up to 16:
    #: ``outbox.provider_outage``), and seconds since the first of them did.
    retrying: int = 0
    retrying_for: float = 0.0
    #: Seconds until claims take the kind again, while its provider's outage holds it, and its
    #: holds in this outage (after a hold, one action at a time probes the provider).
    held_for: float = 0.0
    holds: int = 0

    @property
    def queue(self) -> str:
        """The Dramatiq queue that carries this kind's messages."""
        return ActionKind(self.kind).queue_name


@dataclass(frozen=True, slots=True)
class Backlog:
    """Every declared kind's backlog, by kind name."""

    kinds: dict[str, KindBacklog] = field(default_factory=dict)


def backlog_operation(schema: str) -> Operation[Backlog]:
    """Four short reads: due per kind, in flight per kind, blocked lanes per kind, and the
    kinds whose attempts retry (``outbox.provider_outage``)."""
    q = queries_for(schema)
    due_rows = yield Statement(q["backlog_by_kind"])
    flight_rows = yield Statement(q["executing_by_kind"])
    blocked_rows = yield Statement(q["blocked_lanes_by_kind"])
    retrying_rows = yield Statement(q["provider_outages"], {"kind": None})
    retrying = {
        r["kind"]: (
            int(r["actions"]),
            float(r["retrying_for"]),
            float(r["held_for"]),
            int(r["holds"]),
        )
        for r in retrying_rows
    }
    in_flight = {r["kind"]: int(r["n"]) for r in flight_rows}
    unconsumed = {r["kind"]: int(r["unconsumed"]) for r in flight_rows}
    blocked = {r["kind"]: int(r["lanes"]) for r in blocked_rows}
    return Backlog(
        {r["kind"]: _kind_backlog(r, in_flight, unconsumed, blocked, retrying) for r in due_rows}
    )


def _kind_backlog(
    due: dict[str, Any],
    in_flight: dict[str, int],
    unconsumed: dict[str, int],
    blocked: dict[str, int],
    retrying: dict[str, tuple[int, float, float, int]],
) -> KindBacklog:
    kind = due["kind"]
    actions, retrying_for, held_for, holds = retrying.get(kind, (0, 0.0, 0.0, 0))
    return KindBacklog(
        kind=kind,
        due=int(due["due"]),
        oldest_due_age=float(due["oldest_due_age"]),
        in_flight=in_flight.get(kind, 0),
        blocked_lanes=blocked.get(kind, 0),
        unconsumed=unconsumed.get(kind, 0),
        retrying=actions,
        retrying_for=retrying_for,
        held_for=held_for,
        holds=holds,
    )
