"""Action kinds: what sort of effect an action is, and how its provider tolerates repeats."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from outbox.limits import KindLimits

# fullmatch, not ``$``: a trailing newline must not pass.
_NAME = re.compile(r"[A-Z][A-Z0-9_]{0,62}")


def is_kind_name(name: object) -> bool:
    """Whether ``name`` can name a kind: UPPER_SNAKE_CASE, at most 63 characters."""
    return isinstance(name, str) and _NAME.fullmatch(name) is not None


@dataclass(frozen=True, slots=True)
class ActionKind:
    """A sort of effect. Each kind has exactly one adapter.

    ``at_most_once``: the provider cannot be read back (email), so an action whose write started is
    never attempted again. ``instance_level``: the effect belongs to the instance, not to a
    workspace, so its actions may have no ``workspace_id``. ``limits``: its rate limits and
    concurrency caps (``outbox.limits.KindLimits``; ``OUTBOX_LIMITS`` overrides them).
    """

    name: str
    at_most_once: bool = False
    instance_level: bool = False
    #: Not part of the kind's identity (nor stored): the same kind may carry other limits in
    #: another deployment, and the settings may override them.
    limits: KindLimits | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        if not is_kind_name(self.name):
            raise ValueError(
                f"kind name {self.name!r} must be UPPER_SNAKE_CASE, at most 63 characters"
            )
        if self.limits is not None:
            # Imported here: outbox.limits reads kind names from this module.
            from outbox.limits import KindLimits

            if not isinstance(self.limits, KindLimits):
                raise ValueError(f"limits of {self.name} must be a KindLimits, not {self.limits!r}")

    @property
    def queue_name(self) -> str:
        """The Dramatiq queue that carries this kind's messages (one queue per kind)."""
        return f"outbox.{self.name.lower()}"


#: The built-in email kind: an SMTP relay cannot be asked whether it already took a message.
EMAIL = ActionKind("EMAIL", at_most_once=True, instance_level=True)

#: The built-in webhook kind: a delivery carries a ``webhook-id`` that stays the same on every
#: attempt, and a receiver that dedupes by it takes a resend as the same event. So a resend
#: after an ambiguous failure is safe: read-back (at-least-once delivery, exactly-once effect at
#: such a receiver). Subscriptions belong to the installation, not to a workspace.
WEBHOOK = ActionKind("WEBHOOK", at_most_once=False, instance_level=True)

#: The built-in issue comment kind (GitHub's REST API): every comment carries a hidden marker
#: derived from its idempotency key, so an attempt after an ambiguous failure lists the issue's
#: comments and finds the earlier one instead of posting again.
ISSUE_COMMENT = ActionKind("ISSUE_COMMENT")

#: The built-in chat reply kind (Slack's Web API): every message carries the marker in its
#: metadata, so an attempt after an ambiguous failure reads the thread or channel back first.
CHAT_REPLY = ActionKind("CHAT_REPLY")

BUILTIN_KINDS: tuple[ActionKind, ...] = (EMAIL, WEBHOOK, ISSUE_COMMENT, CHAT_REPLY)
