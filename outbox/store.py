"""The executor's side of the database: claim, fence and fenced finishes (maintenance, which
ends lost leases and expired actions, is ``outbox.maintenance``).

Every statement comes from ``sql/queries.sql``. Each operation is a generator (``outbox._io``)
so it runs on a sync or an async connection; ``Store`` runs them on a pool, one short
autocommit statement at a time, so no connection is held, and no transaction is open, while an
adapter runs.
"""

from __future__ import annotations

import contextvars
from collections.abc import AsyncIterator, Collection, Hashable, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from psycopg import AsyncConnection
from psycopg_pool import AsyncConnectionPool

from outbox._io import Operation, Statement, run_async
from outbox.action import Action
from outbox.batching import GroupWriter, by_id_and_epoch
from outbox.queries import queries_for
from outbox.state import ActionState

T = TypeVar("T")

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


def _claimed(rows: list[dict[str, Any]]) -> list[ClaimedAction]:
    return [ClaimedAction(Action.from_row(row), row["lease_left"]) for row in rows]


#: Most lane-intake rows one claim folds into the lane rows before it reads them. A newsletter
#: of 100,000 enqueues is folded over that many claims (each a few tens of milliseconds).
INTAKE_BATCH = 5000


def intake_operation(schema: str) -> Operation[int]:
    """Folds up to ``INTAKE_BATCH`` lane-intake rows into the lane rows; returns how many."""
    rows = yield Statement(queries_for(schema)["lane_intake"], {"limit": INTAKE_BATCH})
    return int(rows[0]["folded"])


def claim_operation(
    schema: str,
    limits: Mapping[str, int],
    lease: timedelta,
    *,
    take: bool,
    intake: bool = True,
    reclaims_only: Collection[str] = (),
) -> Operation[list[ClaimedAction]]:
    """Per kind, reclaims of expired leases first (they wait for nothing), then due lane heads
    (none for the kinds in ``reclaims_only``); first the lane intake is folded, unless
    ``intake`` is False (the caller folded it).

    ``limits`` maps each kind to the most actions of that kind to claim now. With ``take`` the
    claim is also the take (an in-process executor runs what it claims): the attempt rises and
    the payload is returned. Without, the claimed actions carry no payload (a claimer pushes only
    ``(id, epoch)``, and a payload may be large).
    """
    q = queries_for(schema)
    if intake:
        yield from intake_operation(schema)
    claimed: list[ClaimedAction] = []
    # Statements a kind, so that each kind's bound holds and each is an index range scan.
    for kind, limit in limits.items():
        if limit <= 0:
            continue
        params = {"kind": kind, "limit": limit, "lease": lease, "take": take}
        rows = yield Statement(q["claim_reclaims"], params)
        claimed.extend(_claimed(rows))
        left = limit - len(rows)
        if left > 0 and kind not in reclaims_only:
            rows = yield Statement(q["claim_heads"], {**params, "limit": left})
            claimed.extend(_claimed(rows))
    return claimed


def release_claims_operation(
    schema: str, pairs: Iterable[tuple[int, int]]
) -> Operation[list[tuple[int, int]]]:
    """Gives back claims whose push failed: each ``(id, epoch)`` still EXECUTING at that epoch
    and not taken by a worker becomes ADMITTED and due now. Returns the pairs it gave back."""
    ids, epochs = [], []
    for action_id, epoch in pairs:
        ids.append(action_id)
        epochs.append(epoch)
    if not ids:
        return []
    rows = yield Statement(queries_for(schema)["release_claims"], {"ids": ids, "epochs": epochs})
    return [(row["id"], row["epoch"]) for row in rows]


def _single(name: str, schema: str, params: Mapping[str, Any]) -> Operation[bool]:
    rows = yield Statement(queries_for(schema)[name], params)
    return bool(rows)


def _key(params: Mapping[str, Any]) -> tuple[int, int]:
    return (params["id"], params["epoch"])


def _columns(rows: Sequence[dict[str, Any]], **arrays: str) -> dict[str, list[Any]]:
    """``[{"id": 1, ...}, {"id": 2, ...}]`` -> ``{"ids": [1, 2], ...}`` for an ``unnest``."""
    return {array: [row[column] for row in rows] for array, column in arrays.items()}


class Store:
    """Runs the executor's operations on an async pool, one short statement at a time."""

    def __init__(self, pool: AsyncConnectionPool, schema: str, lease: timedelta) -> None:
        self.pool = pool
        self.schema = schema
        #: The lease a worker's take starts afresh (the claimers' lease: one setting).
        self.lease = lease
        # Group commit (outbox.batching): concurrent takes, fences and ends of this process
        # share statements; each row keeps its own epoch check.
        self._take = GroupWriter("take_attempt", self._take_many, self._take_one, _key)
        self._fence = GroupWriter("begin_write", self._fence_many, self._fence_one, _key)
        self._end = GroupWriter("finish_end", self._end_many, self._end_one, _key)

    @property
    def group_writers(self) -> tuple[GroupWriter[Any, Any], ...]:
        return (self._take, self._fence, self._end)

    async def _rows(self, name: str, params: Mapping[str, Any]) -> list[dict[str, Any]]:
        def op() -> Operation[list[dict[str, Any]]]:
            return (yield Statement(queries_for(self.schema)[name], params))

        return await self.run(op())

    async def _take_one(self, p: dict[str, Any]) -> ClaimedAction | None:
        rows = await self._rows("take_attempt", p)
        return _claimed(rows)[0] if rows else None

    async def _take_many(self, ps: Sequence[dict[str, Any]]) -> dict[Hashable, ClaimedAction]:
        params = {**_columns(ps, ids="id", epochs="epoch"), "lease": self.lease}
        rows = await self._rows("take_attempts", params)
        return {k: _claimed([row])[0] for k, row in by_id_and_epoch(rows).items()}

    async def _fence_one(self, p: dict[str, Any]) -> bool:
        return bool(await self._rows("begin_write", p))

    async def _fence_many(self, ps: Sequence[dict[str, Any]]) -> dict[Hashable, bool]:
        params = _columns(ps, ids="id", epochs="epoch", margins="margin")
        return dict.fromkeys(by_id_and_epoch(await self._rows("begin_writes", params)), True)

    async def _end_one(self, p: dict[str, Any]) -> bool:
        return bool(await self._rows("finish_end", p))

    async def _end_many(self, ps: Sequence[dict[str, Any]]) -> dict[Hashable, bool]:
        params = _columns(
            ps,
            ids="id",
            epochs="epoch",
            states="state",
            reasons="reason",
            refs="ref",
            causes="cause",
        )
        return dict.fromkeys(by_id_and_epoch(await self._rows("finish_ends", params)), True)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        token = held_connections.set(held_connections.get() + 1)
        try:
            async with self.pool.connection() as conn:
                yield conn
        finally:
            held_connections.reset(token)

    async def run(self, op: Operation[T]) -> T:
        async with self.connection() as conn:
            return await run_async(conn, op)

    async def claim(
        self, limits: Mapping[str, int], lease: timedelta, *, take: bool = True
    ) -> list[ClaimedAction]:
        """Claims; with ``take`` (an executor in this process runs what it claims) it takes at
        once, without (a claimer that pushes) it leaves the take to a worker."""
        return await self.run(claim_operation(self.schema, limits, lease, take=take))

    async def take_attempt(self, action_id: int, epoch: int) -> ClaimedAction | None:
        """The executing action a message names, if its epoch still holds, at most once per
        epoch: a second delivery of the same
        ``(action_id, epoch)`` message gets None (the Dramatiq actor drops it as Abandoned)."""

        return await self._take({"id": action_id, "epoch": epoch, "lease": self.lease})

    async def begin_write(self, action_id: int, epoch: int, margin: timedelta) -> bool:
        return bool(await self._fence({"id": action_id, "epoch": epoch, "margin": margin}))

    async def finish_end(
        self,
        action_id: int,
        epoch: int,
        state: ActionState,
        reason: str,
        ref: str | None,
        cause: str | None = None,
    ) -> bool:
        """Ends the action if its epoch holds; ``cause`` is the last retry's reason, when the
        attempts ran out."""
        params = {
            "id": action_id,
            "epoch": epoch,
            "state": state.value,
            "reason": reason,
            "ref": ref,
            "cause": cause,
        }
        return bool(await self._end(params))

    async def finish_retry(
        self, action_id: int, epoch: int, after: timedelta, reason: str | None = None
    ) -> bool:
        params = {"id": action_id, "epoch": epoch, "after": after, "reason": reason}
        return await self.run(_single("finish_retry", self.schema, params))

    async def finish_defer(
        self, action_id: int, epoch: int, after: timedelta, reason: str | None = None
    ) -> bool:
        params = {"id": action_id, "epoch": epoch, "after": after, "reason": reason}
        return await self.run(_single("finish_defer", self.schema, params))

    async def in_flight(self, kinds: Iterable[str]) -> dict[str, int]:
        """Claimed-and-unfinished actions per kind, with a lease that still runs."""

        def op() -> Operation[dict[str, int]]:
            rows = yield Statement(queries_for(self.schema)["executing_by_kind"])
            return {row["kind"]: row["n"] for row in rows}

        counts = await self.run(op())
        return {kind: counts.get(kind, 0) for kind in kinds}
