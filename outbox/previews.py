"""What a prune or an erasure would delete, counted by kind and state before anything is
deleted: ``outbox prune --dry-run`` and ``outbox erase --dry-run`` print it, and the commands
show it when they ask for a confirmation."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from outbox._io import Operation, Statement
from outbox.errors import ConfigurationError, InvalidActionRequest
from outbox.queries import queries_for
from outbox.state import ActionState


@dataclass(frozen=True, slots=True)
class DeletionPreview:
    """Actions a deletion would take, by (kind, state)."""

    counts: dict[tuple[str, str], int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    @property
    def by_state(self) -> dict[str, int]:
        states: Counter[str] = Counter()
        for (_, state), n in self.counts.items():
            states[state] += n
        return dict(sorted(states.items()))

    @property
    def uncertain(self) -> int:
        """UNCERTAIN actions among them: each may or may not have reached its provider, and
        once deleted nobody can look it up to resolve it."""
        return self.by_state.get(ActionState.UNCERTAIN.value, 0)

    def as_rows(self) -> list[dict[str, Any]]:
        return [{"kind": k, "state": s, "actions": n} for (k, s), n in self.counts.items()]

    def render(self) -> str:
        """A small table: kind, state, actions; one line a pair, then the total."""
        if not self.counts:
            return "  (none)"
        width = max(len("kind"), *(len(kind) for kind, _ in self.counts))
        lines = [f"  {'kind':<{width}}  {'state':<10} {'actions':>8}"]
        for (kind, state), n in self.counts.items():
            lines.append(f"  {kind:<{width}}  {state:<10} {n:>8,}")
        lines.append(f"  {'total':<{width}}  {'':<10} {self.total:>8,}")
        return "\n".join(lines)


def _preview(rows: list[dict[str, Any]]) -> DeletionPreview:
    return DeletionPreview({(row["kind"], row["state"]): int(row["n"]) for row in rows})


def prune_preview_operation(schema: str, retention: timedelta) -> Operation[DeletionPreview]:
    if retention < timedelta(0):
        raise ConfigurationError(f"retention must not be negative, got {retention}")
    rows = yield Statement(queries_for(schema)["prune_preview"], {"retention": retention})
    return _preview(rows)


def erase_preview_operation(schema: str, account_id: str | int) -> Operation[DeletionPreview]:
    if account_id is None or str(account_id) == "":
        raise InvalidActionRequest("account_id", "give the account whose actions to erase")
    rows = yield Statement(queries_for(schema)["erase_preview"], {"account_id": str(account_id)})
    return _preview(rows)
