"""``ActionRequest``: what an application asks the outbox to carry out, checked field by field."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox.errors import InvalidActionRequest
from outbox.kinds import ActionKind


@dataclass(frozen=True, slots=True)
class ActionRequest:
    """One effect to carry out.

    ``lane_key``: actions with the same key never run at the same time and run in id order.
    ``idempotency_key``: the natural key of the effect; a second enqueue returns the first action.
    ``payload``: JSON the adapter needs; keep it to identifiers the adapter can read the rest by.
    ``subject_account_id``: the account the effect addresses; erasing it deletes the action.
    ``proposal``: an agent's proposal starts PROPOSED and waits for ``admit`` or ``refuse``.
    """

    kind: ActionKind | str
    lane_key: str
    idempotency_key: str
    payload: Any = field(default_factory=dict)
    workspace_id: str | int | None = None
    subject_account_id: str | int | None = None
    max_attempts: int = 5
    expires_at: datetime | None = None
    proposal: bool = False

    @property
    def kind_name(self) -> str:
        return self.kind.name if isinstance(self.kind, ActionKind) else self.kind

    def validate(self) -> None:
        """Raises ``InvalidActionRequest`` naming the first bad field."""
        if not isinstance(self.kind_name, str) or not self.kind_name:
            raise InvalidActionRequest("kind", "must be an ActionKind or a non-empty kind name")
        for name in ("lane_key", "idempotency_key"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip():
                raise InvalidActionRequest(name, "must be a non-empty string")
        kind = self.kind
        if isinstance(kind, ActionKind) and self.workspace_id is None and not kind.instance_level:
            raise InvalidActionRequest(
                "workspace_id", f"kind {kind.name} is not instance-level: give a workspace"
            )
        if self.payload is None:
            raise InvalidActionRequest("payload", "must be JSON, not None (use {} for nothing)")
        try:
            json.dumps(self.payload, allow_nan=False)
        except (TypeError, ValueError) as error:
            raise InvalidActionRequest("payload", f"is not JSON-serialisable: {error}") from None
        if (
            isinstance(self.max_attempts, bool)
            or not isinstance(self.max_attempts, int)
            or self.max_attempts < 1
        ):
            raise InvalidActionRequest("max_attempts", "must be an integer >= 1")
        expires_at = self.expires_at
        if expires_at is not None and (
            not isinstance(expires_at, datetime) or expires_at.tzinfo is None
        ):
            raise InvalidActionRequest("expires_at", "must be a timezone-aware datetime")
        for name in ("workspace_id", "subject_account_id"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, str | int)
                or (isinstance(value, str) and not value)
            ):
                raise InvalidActionRequest(name, "must be a non-empty string, an integer, or None")


def as_text(value: str | int | None) -> str | None:
    """Workspace and account ids are the application's: stored as text."""
    return None if value is None else str(value)
