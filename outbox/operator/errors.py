"""Why an operator verb changed nothing."""

from __future__ import annotations

from outbox.errors import OutboxError


class OperatorRefused(OutboxError):
    """The verb does not apply to the action as it is now (resolve on an action that is not
    UNCERTAIN, cancel on one that is executing, ...). ``action_id`` names it, ``state`` is what
    it was found in (None when there is no such action). Nothing was written."""

    def __init__(self, message: str, *, action_id: int | None = None, state: str | None = None):
        super().__init__(message)
        self.action_id = action_id
        self.state = state


class NothingToResend(OperatorRefused):
    """A resend or retry needs the action's payload, and none is kept any more (its parked
    payload was dropped after ``OUTBOX_PARKED_PAYLOAD_RETENTION``, or the action ended before
    payloads were parked): pass ``payload=`` to supply it again, or enqueue anew from the
    application."""
