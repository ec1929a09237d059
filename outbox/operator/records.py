"""The records the operator's service layer reads and returns: plain frozen dataclasses, ready
for JSON (``as_dict``) and for a template."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from outbox.action import Action


class Outcome(StrEnum):
    """What a person found out about an UNCERTAIN action."""

    DELIVERED = "DELIVERED"
    NOT_DELIVERED = "NOT_DELIVERED"


class BulkVerb(StrEnum):
    """The verbs that have a bulk form (``bulk_count``, ``bulk_apply``)."""

    #: UNCERTAIN actions resolved DELIVERED.
    RESOLVE_DELIVERED = "resolve-delivered"
    #: UNCERTAIN actions resolved NOT_DELIVERED (without a resend).
    RESOLVE_NOT_DELIVERED = "resolve-not-delivered"
    #: UNCERTAIN actions resolved NOT_DELIVERED, each resent.
    RESEND = "resend"
    #: FAILED or CANCELLED actions retried as new linked actions.
    RETRY = "retry"
    #: Waiting (PROPOSED, ADMITTED) actions cancelled.
    CANCEL = "cancel"
    #: Proposals admitted.
    ADMIT = "admit"
    #: Proposals refused.
    REFUSE = "refuse"


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt (a worker's take of one epoch, or an in-process claim that is its own take).

    ``result`` is DONE, UNCERTAIN, FAILED, CANCELLED, RETRY or DEFER, or None while it runs;
    ``lost`` is True when it has no result and the action moved on (its lease ran out: a killed
    or stalled worker), or ended by housekeeping (``result`` then says how). ``provider_ref`` is
    what the adapter recorded (for email ``message-id=<...>`` and, once the relay answered,
    ``queue-id=...``). Never a payload, an address or an exception's text."""

    action_id: int
    epoch: int
    attempt: int
    claimed_at: datetime
    taken_at: datetime
    fence_passed_at: datetime | None
    ended_at: datetime | None
    result: str | None
    reason: str | None
    provider_ref: str | None
    error_class: str | None
    lost: bool = False

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class Resolution:
    """What a person recorded about an ended action: who, when, what, and a note."""

    action_id: int
    outcome: Outcome
    note: str | None
    resolved_by: str
    resolved_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ActionLink:
    """A new action made from an ended one: ``relation`` is RESEND (after NOT_DELIVERED) or
    RETRY (of a FAILED or CANCELLED one)."""

    from_id: int
    to_id: int
    relation: str
    created_by: str
    created_at: datetime

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ActionRecord:
    """Everything an operator reads about one action: the row (payload left out unless asked
    for), its attempts oldest first, its resolution, the links that lead to it (``earlier``)
    and from it (``later``), and whether a payload is parked for a resend or retry."""

    action: Action
    attempts: list[AttemptRecord] = field(default_factory=list)
    resolution: Resolution | None = None
    earlier: list[ActionLink] = field(default_factory=list)
    later: list[ActionLink] = field(default_factory=list)
    payload_parked: bool = False

    def as_dict(self) -> dict[str, Any]:
        action = self.action.as_dict()
        action.pop("created", None)
        return {
            "action": action,
            "attempts": [a.as_dict() for a in self.attempts],
            "resolution": self.resolution.as_dict() if self.resolution else None,
            "earlier": [link.as_dict() for link in self.earlier],
            "later": [link.as_dict() for link in self.later],
            "payload_parked": self.payload_parked,
        }


@dataclass(frozen=True, slots=True)
class ResolveResult:
    """What ``resolve`` did: the resolution (the existing one when the action was resolved
    before with the same outcome: resolving twice changes nothing), and the resent action, if
    any (the same one on a second call: its idempotency key is derived)."""

    resolution: Resolution
    resent: Action | None = None
    created: bool = True


@dataclass(frozen=True, slots=True)
class KindPause:
    """A paused kind: the claimers claim none of its actions until it is resumed."""

    kind: str
    paused_by: str
    paused_at: datetime
    note: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class LiveProcess:
    """A claimer or worker process that sent a heartbeat lately. ``age`` is the seconds since
    its last heartbeat, by the database clock; ``kinds`` what it claims or runs."""

    process_id: str
    role: str
    host: str
    pid: int
    kinds: list[str]
    started_at: datetime
    last_seen: datetime
    in_flight: int
    age: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One operator action: who, when, which verb, on what, and how it came out (``applied``,
    ``refused``, ``unchanged``); ``detail`` holds the verb's arguments (a note, a filter, a
    count)."""

    id: int
    at: datetime
    actor: str
    verb: str
    action_id: int | None
    kind: str | None
    outcome: str
    detail: dict[str, Any] | None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ActionFilter:
    """Which actions a bulk verb (or a listing) covers; every field given must match (an empty
    tuple or None matches everything). ``created_from``/``created_to`` bound ``created_at``,
    ``ended_from``/``ended_to`` bound ``ended_at`` (half-open: from <= t < to). ``lanes`` are
    exact lane keys. ``limit`` caps how many one bulk call touches (None: all)."""

    kinds: tuple[str, ...] = ()
    states: tuple[str, ...] = ()
    reasons: tuple[str, ...] = ()
    lanes: tuple[str, ...] = ()
    created_from: datetime | None = None
    created_to: datetime | None = None
    ended_from: datetime | None = None
    ended_to: datetime | None = None
    limit: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            k: (v.isoformat() if isinstance(v, datetime) else v) for k, v in asdict(self).items()
        }


@dataclass(frozen=True, slots=True)
class BulkResult:
    """What ``bulk_apply`` did: how many the filter matched for the verb, how many it changed,
    and each refusal (an action that moved on between the count and its turn) by id."""

    verb: BulkVerb
    matched: int
    applied: int
    refused: dict[int, str] = field(default_factory=dict)
    new_action_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
