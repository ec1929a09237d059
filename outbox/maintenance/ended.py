"""What the services that end actions report: one record an ended action."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from outbox.state import ActionState


@dataclass(frozen=True, slots=True)
class EndedByHousekeeping:
    """An action a maintenance service ended, with the state and stop reason it wrote."""

    id: int
    kind: str
    state: ActionState
    reason: str


def ended_from_rows(rows: list[dict[str, Any]]) -> list[EndedByHousekeeping]:
    """``RETURNING id, kind, state, stop_reason`` rows as records."""
    return [
        EndedByHousekeeping(r["id"], r["kind"], ActionState(r["state"]), r["stop_reason"])
        for r in rows
    ]
