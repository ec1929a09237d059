"""The project's outbox: one kind, and an adapter that records what it carried out."""

from __future__ import annotations

from typing import Any

from outbox import ActionKind, Done, Outbox

THANKS = ActionKind("THANKS")


class Thanks:
    def __init__(self) -> None:
        self.sent: list[Any] = []

    async def execute(self, attempt):
        self.sent.append(attempt.payload)
        return Done("thanked")


thanks = Thanks()
outbox = Outbox()
outbox.register(THANKS, thanks)
