"""The action row as Python sees it."""

from __future__ import annotations

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
