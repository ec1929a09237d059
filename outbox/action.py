"""The action row as Python sees it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
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
        values = {name: row[name] for name in _FIELD_NAMES if name in row}
        values["state"] = ActionState(values["state"])
        return cls(**values)

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


def _setter(name: str) -> Callable[[Action, Any], None]:
    """The field's own slot setter (its member descriptor's ``__set__``): what the frozen
    dataclass's ``__init__`` reaches through ``object.__setattr__`` and a lookup by name."""
    setter: Callable[[Action, Any], None] = vars(Action)[name].__set__
    return setter


# In field order; one more or fewer field than these names fails the import.
(
    _set_id,
    _set_kind,
    _set_state,
    _set_workspace_id,
    _set_lane_key,
    _set_idempotency_key,
    _set_payload,
    _set_subject_account_id,
    _set_max_attempts,
    _set_expires_at,
    _set_attempt,
    _set_epoch,
    _set_available_at,
    _set_lease_until,
    _set_write_started_at,
    _set_readback_ref,
    _set_stop_reason,
    _set_created_at,
    _set_ended_at,
    _set_retry_reason,
    _set_earlier_write_at,
    _set_priority,
    _set_limit_key,
    _set_created,
) = map(_setter, _FIELD_NAMES)


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
    (None, 0, ``created`` True), made in half the time.

    An enqueue of 1,000 makes 1,000 of them, and the frozen dataclass's ``__init__`` sets each
    of 24 fields through ``object.__setattr__`` (a name looked up on the class, then the slot
    set); this sets each slot with its own setter, once, before the action is returned. The
    result is an ordinary ``Action``: equal, hashed and frozen as any other."""
    action: Action = object.__new__(Action)
    _set_id(action, id)
    _set_kind(action, kind)
    _set_state(action, state)
    _set_workspace_id(action, workspace_id)
    _set_lane_key(action, lane_key)
    _set_idempotency_key(action, idempotency_key)
    _set_payload(action, payload)
    _set_subject_account_id(action, subject_account_id)
    _set_max_attempts(action, max_attempts)
    _set_expires_at(action, expires_at)
    _set_attempt(action, 0)
    _set_epoch(action, 0)
    _set_available_at(action, available_at)
    _set_lease_until(action, None)
    _set_write_started_at(action, None)
    _set_readback_ref(action, None)
    _set_stop_reason(action, None)
    _set_created_at(action, created_at)
    _set_ended_at(action, None)
    _set_retry_reason(action, None)
    _set_earlier_write_at(action, None)
    _set_priority(action, priority)
    _set_limit_key(action, limit_key)
    _set_created(action, True)
    return action
