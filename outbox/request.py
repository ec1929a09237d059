"""``ActionRequest``: what an application asks the outbox to carry out, checked field by field."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from outbox.errors import InvalidActionRequest
from outbox.kinds import ActionKind, is_kind_name
from outbox.request_checks import (
    DEFAULT_MAX_PAYLOAD_BYTES,
    MAX_ATTEMPTS,
    MAX_PRIORITY,
    MIN_PRIORITY,
    check_expires_at,
    check_max_attempts,
    check_priority,
    check_text,
    checked_payload,
    id_text,
)


@dataclass(frozen=True, slots=True)
class ActionRequest:
    """One effect to carry out.

    ``lane_key``: actions with the same key never run at the same time and run in id order.
    ``idempotency_key``: the natural key of the effect; a second enqueue returns the first action.
    ``payload``: JSON the adapter needs; keep it to identifiers the adapter can read the rest by.
    ``subject_account_id``: the account the effect addresses; erasing it deletes the action.
    ``proposal``: an agent's proposal starts PROPOSED and waits for ``admit`` or ``refuse``.
    ``not_before``: the action never runs before then (a scheduled send); it holds its lane
    until then, as a lane's head does.
    ``priority``: -100 to 100, higher first among the due actions of its kind (0 by default).
    ``limit_key``: what per-key rate limits, concurrency caps and fairness count it under (a
    recipient domain, a provider account); its workspace when not given.
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
    not_before: datetime | None = None
    priority: int = 0
    limit_key: str | int | None = None

    @property
    def kind_name(self) -> str:
        return self.kind.name if isinstance(self.kind, ActionKind) else self.kind

    def validate(self, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> bytes:
        """Raises ``InvalidActionRequest`` naming the first bad field (see
        ``outbox.request_checks`` for the limits); returns the payload as the JSON bytes the
        database receives, so that it is encoded once."""
        return self.checked(max_payload_bytes)[0].encode("utf-8")

    def checked(self, max_payload_bytes: int = DEFAULT_MAX_PAYLOAD_BYTES) -> tuple[str, Any]:
        """``validate``'s checks; returns the payload's JSON as text and the value it decodes to
        (an equal copy that shares nothing with ``payload``, as the enqueued action holds it)."""
        kind = self.kind
        if type(kind) is str and kind in _KIND_NAMES:
            instance_level: bool | None = None  # the database's kind table decides
        elif isinstance(kind, ActionKind):
            instance_level = kind.instance_level
        elif is_kind_name(kind):
            instance_level = None
            if type(kind) is str and len(_KIND_NAMES) < _KIND_NAMES_KEPT:
                _KIND_NAMES.add(kind)
        else:
            raise InvalidActionRequest(
                "kind",
                "must be an ActionKind or a kind name (UPPER_SNAKE_CASE, at most 63 characters)",
            )
        _check_key("lane_key", self.lane_key)
        _check_key("idempotency_key", self.idempotency_key)
        if self.workspace_id is None and instance_level is False:
            raise InvalidActionRequest(
                "workspace_id", f"kind {self.kind_name} is not instance-level: give a workspace"
            )
        payload = checked_payload(self.payload, max_payload_bytes)
        # A plain int in range passes without a call (the common case); anything else is
        # judged by the check itself.
        if type(self.max_attempts) is not int or not 1 <= self.max_attempts <= MAX_ATTEMPTS:
            check_max_attempts(self.max_attempts)
        if self.expires_at is not None:
            check_expires_at(self.expires_at)
        if self.not_before is not None:
            check_expires_at(self.not_before, "not_before")
            if self.expires_at is not None and self.not_before >= self.expires_at:
                raise InvalidActionRequest("not_before", "must be before expires_at")
        if type(self.priority) is not int or not MIN_PRIORITY <= self.priority <= MAX_PRIORITY:
            check_priority(self.priority)
        # Mostly None (one or two are given): the test before the call is the common case.
        if self.workspace_id is not None:
            _check_id("workspace_id", self.workspace_id)
        if self.subject_account_id is not None:
            _check_id("subject_account_id", self.subject_account_id)
        if self.limit_key is not None:
            _check_id("limit_key", self.limit_key)
        return payload


#: Kind names found valid so far: an application uses a few, and a set lookup is a fraction of the
#: pattern's match, which every request would otherwise run. Bounded, so that names made up at run
#: time cannot grow it without end (past the bound, a name is matched every time).
_KIND_NAMES: set[str] = set()
_KIND_NAMES_KEPT = 1024


def _check_key(name: str, value: object) -> None:
    """``lane_key`` and ``idempotency_key``: non-empty text, not only spaces, checked as text."""
    if not isinstance(value, str) or not value.strip():
        raise InvalidActionRequest(name, "must be a non-empty string")
    check_text(name, value)


def _check_id(name: str, value: object) -> None:
    """A workspace, account or limit key id that is given: non-empty text or an integer (not a
    bool), checked as the text it is stored as."""
    if type(value) is str and value:  # the common id: text, stored as it is
        check_text(name, value)
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, (str, int))
        or (isinstance(value, str) and not value)
    ):
        raise InvalidActionRequest(name, "must be a non-empty string, an integer, or None")
    id_text(name, value)


def as_text(value: str | int | None) -> str | None:
    """Workspace and account ids are the application's: stored as text."""
    return None if value is None else str(value)
