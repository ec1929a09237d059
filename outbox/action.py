"""The action row as Python sees it."""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import MISSING, dataclass, fields
from datetime import datetime
from typing import Any

from outbox.fence_token import FenceToken
from outbox.state import ActionState


@dataclass(frozen=True, slots=True)
class Action:
    """One row of ``agent_action``. ``created`` tells whether this enqueue inserted it."""

    id: int
    kind: str
    state: ActionState
    workspace_id: str | None
    lane_key: str
    idempotency_key: str
    payload: Any
    subject_account_id: str | None
    max_attempts: int
    expires_at: datetime | None
    attempt: int
    epoch: int
    available_at: datetime
    lease_until: datetime | None
    write_started_at: datetime | None
    readback_ref: str | None
    stop_reason: str | None
    created_at: datetime
    ended_at: datetime | None
    #: The reason of the latest retry or deferral (kept when the attempts run out).
    retry_reason: str | None = None
    #: When an earlier attempt started its write (kept through retries and deferrals).
    earlier_write_at: datetime | None = None
    #: Higher first among the due actions of its kind (-100 to 100).
    priority: int = 0
    #: What per-key limits and fairness count it under, when not its workspace.
    limit_key: str | None = None
    created: bool = False

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Action:
        """The action of a row with its columns (others ignored); a column the row lacks takes
        the field's default. Made as ``created_action`` makes one (each slot set once, without
        the frozen ``__init__``'s call a field): every claim reads a row an action, and this
        took 3.5 us a row against 8.9."""
        action: Any = _Unfrozen()
        for name in _FIELD_NAMES:
            setattr(action, name, row[name] if name in row else _DEFAULTS[name])
        state = _STATES.get(action.state)
        action.state = state if state is not None else ActionState(action.state)  # ValueError
        action.__class__ = Action
        made: Action = action
        return made

    @property
    def token(self) -> FenceToken:
        """This claim of the action: every write after the claim holds only under it."""
        return FenceToken(self.id, self.epoch)

    @property
    def effective_limit_key(self) -> str:
        """The key its per-key limits and its fair share go by: ``limit_key``, else the
        workspace, else '' (the lane rows keep the same)."""
        return self.limit_key or self.workspace_id or ""

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


#: Computed once, not per row: ``fields()`` walks the dataclass on every call, and every attempt
#: reads a row.
_FIELD_NAMES = tuple(f.name for f in fields(Action))
#: A field's value when a row lacks its column; a field without a default has no entry (such a
#: row raises KeyError).
_DEFAULTS = {f.name: f.default for f in fields(Action) if f.default is not MISSING}
#: A state by its name (a ``StrEnum``: a state itself finds itself too); a dict lookup, not the
#: enum's call.
_STATES: dict[str, ActionState] = {state.value: state for state in ActionState}


def action_maker(names: Sequence[str], prefix: str = "") -> Callable[[Sequence[Any]], Action]:
    """What makes an ``Action`` of each row of a result whose columns are ``names`` (a row as
    the tuple psycopg reads; the columns named ``prefix`` + a field's name, others ignored; a
    field without its column takes its default): made once a result, then one call a row.

    Every claim and take reads a row an action. ``from_row`` of a dict row cost a dict a row
    (psycopg's ``dict_row``) and a lookup by name a field; here the result's column positions
    are found once, a row is reordered into the fields' order by one ``itemgetter`` call, and
    ``_from_fields`` sets each slot by a plain attribute store."""
    at = {name: i for i, name in enumerate(names)}
    missing = [name for name in _FIELD_NAMES if prefix + name not in at]
    absent = [name for name in missing if name not in _DEFAULTS]
    if absent:
        raise KeyError(f"no column for {', '.join(absent)}")
    defaults = tuple(_DEFAULTS[name] for name in missing)
    width = len(names)
    positions = [
        at[prefix + name] if prefix + name in at else width + missing.index(name)
        for name in _FIELD_NAMES
    ]
    fields_of = operator.itemgetter(*positions)
    if not defaults:
        return lambda row: _from_fields(fields_of(row))
    return lambda row: _from_fields(fields_of((*row, *defaults)))


def _from_fields(v: Sequence[Any]) -> Action:
    """The action of its fields' values, in ``fields(Action)``'s order (``action_maker``);
    made as ``created_action`` makes one. A test holds the order to the dataclass's."""
    action: Any = _Unfrozen()
    action.id = v[0]
    action.kind = v[1]
    state = _STATES.get(v[2])
    action.state = state if state is not None else ActionState(v[2])  # ValueError
    action.workspace_id = v[3]
    action.lane_key = v[4]
    action.idempotency_key = v[5]
    action.payload = v[6]
    action.subject_account_id = v[7]
    action.max_attempts = v[8]
    action.expires_at = v[9]
    action.attempt = v[10]
    action.epoch = v[11]
    action.available_at = v[12]
    action.lease_until = v[13]
    action.write_started_at = v[14]
    action.readback_ref = v[15]
    action.stop_reason = v[16]
    action.created_at = v[17]
    action.ended_at = v[18]
    action.retry_reason = v[19]
    action.earlier_write_at = v[20]
    action.priority = v[21]
    action.limit_key = v[22]
    action.created = v[23]
    action.__class__ = Action
    made: Action = action
    return made


class _Unfrozen:
    """``Action``'s layout (the same slots, in the same order), without its frozen
    ``__setattr__``: an action is made as one of these and then becomes an ``Action``
    (``created_action``), which Python allows between classes of the same layout."""

    __slots__ = Action.__slots__


def created_action(
    id: int,
    available_at: datetime,
    created_at: datetime,
    payload: Any,
    kind: str,
    state: ActionState,
    workspace_id: str | None,
    lane_key: str,
    idempotency_key: str,
    subject_account_id: str | None,
    max_attempts: int,
    expires_at: datetime | None,
    priority: int,
    limit_key: str | None,
) -> Action:
    """The action an enqueue just inserted (no attempt yet, ``created``): ``Action(...)`` of
    these values (what the database made first, then what the request gave), the rest unset
    (None, 0, ``created`` True), made in an eighth of the time.

    An enqueue of 1,000 makes 1,000 of them, and the frozen dataclass's ``__init__`` sets each
    of 24 fields through ``object.__setattr__`` (a call, and the name looked up on the class).
    Here each slot is set as a plain attribute of an ``_Unfrozen`` (which the interpreter does
    without a call), once, and the object's class is then made ``Action``, before anyone sees
    it: the result is an ordinary ``Action``, equal, hashed and frozen as any other. Every field
    must be set here (a test compares each with the dataclass's own)."""
    action: Any = _Unfrozen()
    action.id = id
    action.kind = kind
    action.state = state
    action.workspace_id = workspace_id
    action.lane_key = lane_key
    action.idempotency_key = idempotency_key
    action.payload = payload
    action.subject_account_id = subject_account_id
    action.max_attempts = max_attempts
    action.expires_at = expires_at
    action.attempt = 0
    action.epoch = 0
    action.available_at = available_at
    action.lease_until = None
    action.write_started_at = None
    action.readback_ref = None
    action.stop_reason = None
    action.created_at = created_at
    action.ended_at = None
    action.retry_reason = None
    action.earlier_write_at = None
    action.priority = priority
    action.limit_key = limit_key
    action.created = True
    action.__class__ = Action
    made: Action = action  # (typed Any above: mypy knows no attributes of an _Unfrozen)
    return made
