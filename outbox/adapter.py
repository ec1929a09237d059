"""The interface every kind's adapter implements."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from outbox.attempt import ActionAttempt
    from outbox.results import Result


@runtime_checkable
class ActionAdapter(Protocol):
    """Carries out one kind's effect. Only ``ActionExecutor`` calls ``execute``.

    ``execute`` must await ``attempt.fence().begin_write()`` right before the provider call and
    return ``Abandoned()`` without calling the provider when it is refused. A read-back adapter
    looks for its earlier write (by a marker) first when ``attempt.write_started`` is true.
    """

    async def execute(self, attempt: ActionAttempt) -> Result: ...
