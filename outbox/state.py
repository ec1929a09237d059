"""The lifecycle of an action: its states, the transitions between them, and stop reasons.

The trigger ``guard_agent_action`` (migrations/0001_core.sql) carries the same table in SQL;
``tests/test_core_trigger.py`` walks all 49 ordered pairs and checks that both agree.
"""

from __future__ import annotations

from enum import StrEnum


class ActionState(StrEnum):
    PROPOSED = "PROPOSED"
    ADMITTED = "ADMITTED"
    EXECUTING = "EXECUTING"
    DONE = "DONE"
    UNCERTAIN = "UNCERTAIN"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"

    @property
    def is_ended(self) -> bool:
        return self in _ENDED

    @property
    def is_pending(self) -> bool:
        """Waiting to start: it blocks later actions of its lane."""
        return self in (ActionState.PROPOSED, ActionState.ADMITTED)

    def can_become(self, new: ActionState) -> bool:
        """Whether an update of a row in this state to ``new`` is legal.

        A pending row may be updated in place (same state, say ``available_at``); EXECUTING to
        EXECUTING is a reclaim (the trigger also demands the epoch rise by one); an ended row
        never changes.
        """
        return new in _ALLOWED[self]


_ENDED = frozenset(
    {ActionState.DONE, ActionState.UNCERTAIN, ActionState.FAILED, ActionState.CANCELLED}
)

_ALLOWED: dict[ActionState, frozenset[ActionState]] = {
    ActionState.PROPOSED: frozenset(
        {ActionState.PROPOSED, ActionState.ADMITTED, ActionState.CANCELLED}
    ),
    ActionState.ADMITTED: frozenset(
        {ActionState.ADMITTED, ActionState.EXECUTING, ActionState.CANCELLED}
    ),
    ActionState.EXECUTING: frozenset({ActionState.EXECUTING, ActionState.ADMITTED}) | _ENDED,
    ActionState.DONE: frozenset(),
    ActionState.UNCERTAIN: frozenset(),
    ActionState.FAILED: frozenset(),
    ActionState.CANCELLED: frozenset(),
}


class StopReason:
    """Stop reasons the outbox itself writes. Adapters may give reasons of their own."""

    #: The provider confirmed the effect.
    DONE = "DONE"
    #: The last allowed attempt asked for a retry, or lost its lease before its write.
    ATTEMPTS_EXHAUSTED = "ATTEMPTS_EXHAUSTED"
    #: An at-most-once action's lease expired after its write started: it may have happened.
    LEASE_LOST_AFTER_WRITE = "LEASE_LOST_AFTER_WRITE"
    #: It had not started by ``expires_at``.
    EXPIRED = "EXPIRED"
    #: A proposal that was refused (``refuse``) without its own reason.
    REFUSED = "REFUSED"
    #: The adapter raised after the fence: the effect may exist.
    ADAPTER_ERROR_AFTER_WRITE = "ADAPTER_ERROR_AFTER_WRITE"
    #: The adapter was still running when its lease ended, after its write started.
    LEASE_EXPIRED_DURING_WRITE = "LEASE_EXPIRED_DURING_WRITE"
    #: The adapter cannot build what it would send (an email whose notice renders a malformed
    #: address, subject or URL): every attempt would fail alike, so the first one ends it.
    MESSAGE_INVALID = "MESSAGE_INVALID"
