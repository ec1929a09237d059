"""The executor's side of the database: claim, housekeeping, fence and fenced finishes.

Every statement comes from ``sql/queries.sql``. Each operation is a generator (``outbox._io``)
so it runs on a sync or an async connection; ``Store`` runs them on a pool, one short
autocommit statement at a time, so no connection is held, and no transaction is open, while an
adapter runs.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from outbox._io import Operation, Statement, run_async
from outbox.action import Action
from outbox.queries import queries_for
from outbox.state import ActionState

#: How many connections of an outbox pool the current task holds. The executor refuses to call
#: an adapter while it is not zero (no provider call inside a database transaction).
held_connections: contextvars.ContextVar[int] = contextvars.ContextVar(
    "outbox_held_connections", default=0
)


@dataclass(frozen=True, slots=True)
class ClaimedAction:
    """An action this claim took, with the lease it has left by the database clock."""

    action: Action
    lease_left: timedelta


@dataclass(frozen=True, slots=True)
class EndedByHousekeeping:
    id: int
    kind: str
    state: ActionState
    reason: str


def _claimed(rows: list[dict[str, Any]]) -> list[ClaimedAction]:
    return [ClaimedAction(Action.from_row(row), row["lease_left"]) for row in rows]


def claim_operation(
    schema: str, limits: Mapping[str, int], lease: timedelta
) -> Operation[list[ClaimedAction]]:
    """Reclaims of expired leases first (they wait for nothing), then due lane heads.

    ``limits`` maps each kind to the most actions of that kind to claim now.
    """
    q = queries_for(schema)
    claimed: list[ClaimedAction] = []
    wanted = {kind: n for kind, n in limits.items() if n > 0}
    if not wanted:
        return claimed
    total = sum(wanted.values())
    rows = yield Statement(
        q["claim_reclaims"], {"kinds": list(wanted), "limit": total, "lease": lease}
    )
    for item in _claimed(rows):
        claimed.append(item)
        wanted[item.action.kind] -= 1
    # One statement a kind, so that each kind's bound holds and each is an index range scan.
    for kind, n in wanted.items():
        if n > 0:
            rows = yield Statement(q["claim_heads"], {"kind": kind, "limit": n, "lease": lease})
            claimed.extend(_claimed(rows))
    return claimed


def housekeeping_operation(schema: str, limit: int = 1000) -> Operation[list[EndedByHousekeeping]]:
    """Ends lost leases that may not run again, and waiting actions past their expiry."""
    q = queries_for(schema)
    ended: list[EndedByHousekeeping] = []
    for name in ("end_lost_leases", "expire_waiting"):
        rows = yield Statement(q[name], {"limit": limit})
        ended.extend(
            EndedByHousekeeping(r["id"], r["kind"], ActionState(r["state"]), r["stop_reason"])
            for r in rows
        )
    return ended


def _single(name: str, schema: str, params: Mapping[str, Any]) -> Operation[bool]:
    rows = yield Statement(queries_for(schema)[name], params)
    return bool(rows)


class Store:
    """Runs the executor's operations on an async pool, one short statement at a time."""

    def __init__(self, pool: AsyncConnectionPool, schema: str) -> None:
        self.pool = pool
        self.schema = schema

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        token = held_connections.set(held_connections.get() + 1)
        try:
            async with self.pool.connection() as conn:
                yield conn
        finally:
            held_connections.reset(token)

    async def run(self, op: Operation[Any]) -> Any:
        async with self.connection() as conn:
            return await run_async(conn, op)

    async def claim(self, limits: Mapping[str, int], lease: timedelta) -> list[ClaimedAction]:
        return await self.run(claim_operation(self.schema, limits, lease))

    async def housekeep(self, limit: int = 1000) -> list[EndedByHousekeeping]:
        return await self.run(housekeeping_operation(self.schema, limit))

    async def load_attempt(self, action_id: int, epoch: int) -> ClaimedAction | None:
        def op() -> Operation[ClaimedAction | None]:
            rows = yield Statement(
                queries_for(self.schema)["load_attempt"], {"id": action_id, "epoch": epoch}
            )
            return _claimed(rows)[0] if rows else None

        return await self.run(op())

    async def take_attempt(self, action_id: int, epoch: int) -> ClaimedAction | None:
        """Like ``load_attempt``, and at most once per epoch: a second delivery of the same
        ``(action_id, epoch)`` message gets None (the Dramatiq actor drops it as Abandoned)."""

        def op() -> Operation[ClaimedAction | None]:
            rows = yield Statement(
                queries_for(self.schema)["take_attempt"], {"id": action_id, "epoch": epoch}
            )
            return _claimed(rows)[0] if rows else None

        return await self.run(op())

    async def begin_write(self, action_id: int, epoch: int, margin: timedelta) -> bool:
        params = {"id": action_id, "epoch": epoch, "margin": margin}
        return await self.run(_single("begin_write", self.schema, params))

    async def finish_end(
        self, action_id: int, epoch: int, state: ActionState, reason: str, ref: str | None
    ) -> bool:
        params = {
            "id": action_id,
            "epoch": epoch,
            "state": state.value,
            "reason": reason,
            "ref": ref,
        }
        return await self.run(_single("finish_end", self.schema, params))

    async def finish_retry(self, action_id: int, epoch: int, after: timedelta) -> bool:
        params = {"id": action_id, "epoch": epoch, "after": after}
        return await self.run(_single("finish_retry", self.schema, params))

    async def finish_defer(self, action_id: int, epoch: int, after: timedelta) -> bool:
        params = {"id": action_id, "epoch": epoch, "after": after}
        return await self.run(_single("finish_defer", self.schema, params))

    async def make_due(self) -> None:
        def op() -> Operation[None]:
            yield Statement(queries_for(self.schema)["make_due"])

        await self.run(op())

    async def in_flight(self, kinds: Iterable[str]) -> dict[str, int]:
        """Claimed-and-unfinished actions per kind, with a lease that still runs."""

        def op() -> Operation[dict[str, int]]:
            rows = yield Statement(queries_for(self.schema)["executing_by_kind"])
            return {row["kind"]: row["n"] for row in rows}

        counts = await self.run(op())
        return {kind: counts.get(kind, 0) for kind in kinds}
