"""What the restart scenarios (``db-restart``, ``broker-restart``) report of the actions a
server's restart caught, from the moment it was back."""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from benchmarks.common import ms


@dataclass(frozen=True)
class Caught:
    """``resume``: seconds from the server's return to the first end after it; ``recovered``:
    to the last caught action's end (``resume`` when none was caught, as in a tiny run);
    ``left_to_lease``: caught actions that ended more than half a lease after it (they waited to
    be reclaimed)."""

    resume: float
    recovered: float
    left_to_lease: int

    @classmethod
    def of(
        cls, ended: Mapping[int, float], caught: Collection[int], back: float, lease: float
    ) -> Caught:
        """``ended``: each action's end (epoch seconds); ``caught``: the ids the restart
        caught; ``back``: when the server answered again."""
        resume = min((at - back for at in ended.values() if at > back), default=0.0)
        return cls(
            resume=resume,
            recovered=max((ended[i] - back for i in caught), default=resume),
            left_to_lease=sum(1 for i in caught if ended[i] - back > lease / 2),
        )

    def report(self) -> dict[str, Any]:
        return {
            "resume_ms": ms(self.resume),
            "recovered_ms": ms(self.recovered),
            "left_to_lease": self.left_to_lease,
        }
