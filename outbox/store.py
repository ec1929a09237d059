"""The executor's side of the database: claim, fence and fenced finishes (maintenance, which
ends lost leases and expired actions, is ``outbox.maintenance``).

Every statement comes from ``sql/queries.sql``. Each operation is a generator (``outbox._io``)
so it runs on a sync or an async connection; ``Store`` runs them on a pool, one short
autocommit statement at a time, so no connection is held, and no transaction is open, while an
adapter runs.
"""

from __future__ import annotations

import contextvars
import functools
import logging
from collections.abc import AsyncIterator, Callable, Collection, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg
from psycopg import AsyncConnection
from psycopg.rows import RowMaker
from psycopg_pool import AsyncConnectionPool

from outbox._io import Operation, Statement, commit_pipelined, run_async
from outbox.action import Action, action_maker
from outbox.batching import GroupWriter
from outbox.binary_arrays import (
    BoolArray,
    Int8,
    Int8Array,
    IntervalArray,
    TextArray,
    TimestamptzArray,
)
from outbox.fence_token import FenceToken
from outbox.provider_outage import DEFAULT_RULE, OutageRule, holds_called_for, outage_note
from outbox.queries import queries_for
from outbox.results import Finish

T = TypeVar("T")

log = logging.getLogger("outbox.store")

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


#: A ``claim_heads`` row as ``claim_rows`` makes it: the action it claimed (None on the row of
#: NULLs of a claim that found nothing), and, on its first row, the limit keys it walked and
#: whether a key took its whole share with room for more (``HeadsClaimed.filled``).
ClaimRow = tuple[ClaimedAction | None, list[str] | None, bool | None]
#: A ``finish_many`` row as ``finish_rows`` makes it: the token it answers, the kind its outage
#: row should hear of (``outage_note``), and the lane's next action when the finish handed on.
FinishRow = tuple[FenceToken, str | None, ClaimedAction | None]


#: The prefix of a finish row's columns of the lane's next action.
_NEXT = "next_"


def _reading(read: Callable[[list[str]], RowMaker[T]]) -> Callable[[Any], RowMaker[T]]:
    """A psycopg row factory (``Statement.rows``) of what ``read`` makes of a result's column
    names: the row maker. psycopg also asks a cursor's factory of a result it holds from
    another statement (when the factory is set on a cursor that ran one) or of a result without
    rows; that maker refuses to make a row, as ``dict_row``'s does."""

    def factory(cursor: Any) -> RowMaker[T]:
        names = [column.name for column in cursor.description or ()]
        try:
            return read(names)
        except (KeyError, ValueError) as error:
            return functools.partial(_not_these_rows, read.__name__, str(error))

    factory.__name__ = read.__name__
    return factory


def _not_these_rows(reader: str, why: str, values: Sequence[Any]) -> Any:
    raise psycopg.InterfaceError(f"{reader}: not the rows of its statement ({why})")


@_reading
def claim_rows(names: list[str]) -> RowMaker[ClaimRow]:
    """The rows of a ``claim_heads``."""
    make = action_maker(names)
    id_at, left_at = names.index("id"), names.index("lease_left")
    walked_at, filled_at = names.index("walked"), names.index("filled")

    def row(values: Sequence[Any]) -> ClaimRow:
        if values[id_at] is None:
            return None, values[walked_at], values[filled_at]
        return ClaimedAction(make(values), values[left_at]), values[walked_at], values[filled_at]

    return row


@_reading
def taken_rows(names: list[str]) -> RowMaker[ClaimedAction]:
    """The rows of a ``take_attempt`` or ``take_attempts``: the actions taken."""
    make = action_maker(names)
    left_at = names.index("lease_left")
    return lambda values: ClaimedAction(make(values), values[left_at])


@_reading
def finish_rows(names: list[str]) -> RowMaker[FinishRow]:
    """The rows of a ``finish_many`` (its successor's columns are named ``next_*``)."""
    make = action_maker(names, _NEXT)
    id_at, epoch_at, kind_at = names.index("id"), names.index("epoch"), names.index("outage_kind")
    next_at, left_at = names.index("next_id"), names.index("next_lease_left")

    def row(values: Sequence[Any]) -> FinishRow:
        token = FenceToken(values[id_at], values[epoch_at])
        if values[next_at] is None:
            return token, values[kind_at], None
        return token, values[kind_at], ClaimedAction(make(values), values[left_at])

    return row


#: Most lanes one claim folds from the lane intake into the lane rows before it reads them. A
#: newsletter of 100,000 lanes is folded over that many claims (each a few tens of milliseconds).
INTAKE_BATCH = 5000


#: Most limit keys one claim of a kind walks (one index probe each): with more keys waiting, the
#: next claim goes on where this one stopped, so every key is reached within a few claims and a
#: claim's cost does not grow with the number of workspaces. Under a key cap a claim walks as
#: many keys as its room needs at the cap (``walk_bound``), and keys at their cap are stepped
#: over without counting.
FAIR_KEYS_PER_CLAIM = 32

#: Most limit keys a claim under a key cap walks (``walk_bound``), and most keys at their cap it
#: steps over besides: one index probe each (about 10 to 20 us), so a claim that finds every key
#: at its cap costs at most 192 probes, where it cost 32 when the walk counted them.
CAPPED_WALK = 128
CAPPED_KEYS_PER_CLAIM = 64


def walk_bound(left: int, key_cap: int | None) -> int:
    """How many limit keys a claim of up to ``left`` heads walks: 32, or, when a key cap lets a
    key give fewer than ``left`` / 32, as many keys as fill ``left`` at the cap (a cap of one
    and a batch of 100: 100 keys), up to ``CAPPED_WALK``; never more than ``left``."""
    if key_cap is None:
        return min(left, FAIR_KEYS_PER_CLAIM)
    return min(left, max(FAIR_KEYS_PER_CLAIM, min(CAPPED_WALK, -(-left // key_cap))))


@dataclass(frozen=True, slots=True)
class Intake:
    """What a claim's first statement said: how many lanes it took off the intake, and which
    kinds an operator paused or their provider's outage holds (none of their actions is
    claimed)."""

    folded: int
    paused: frozenset[str]


def intake_operation(schema: str) -> Operation[Intake]:
    """Folds up to ``INTAKE_BATCH`` lanes of the intake into the lane rows; returns how many, and
    the kinds paused or held."""
    rows = yield Statement(queries_for(schema)["lane_intake"], {"limit": INTAKE_BATCH})
    return Intake(int(rows[0]["folded"]), frozenset(rows[0]["paused"]))


def claim_operation(
    schema: str,
    limits: Mapping[str, int],
    lease: timedelta,
    *,
    take: bool,
    intake: bool = True,
    reclaims_only: Collection[str] = (),
    reclaims_of: Collection[str] | None = None,
    key_caps: Mapping[str, int] | None = None,
    cursor: dict[str, str] | None = None,
    claimer: str | None = None,
) -> Operation[list[ClaimedAction]]:
    """Per kind, reclaims of expired leases first (they wait for nothing), then due lane heads
    (none for the kinds in ``reclaims_only``), in one statement (``claim_heads``); first the
    lane intake is folded, unless ``intake`` is False (the caller folded it). After every kind's
    first statement, a second for each kind whose first left room its other keys may fill
    (``settle_first_claims``). ``Store.claim`` sends the same statements in one round trip.

    ``limits`` maps each kind to the most actions of that kind to claim now. With ``take`` the
    claim is also the take (an in-process executor runs what it claims): the attempt rises and
    the payload is returned. Without, the claimed actions carry no payload (a claimer pushes only
    ``(id, epoch)``, and a payload may be large). A kind an operator paused, or its provider's
    outage holds, is skipped (the intake says which; a caller that folded it passes no limit for
    them), and after a hold ``claim_heads`` takes one action of the kind at a time.

    Lane heads are claimed fairly between limit keys (``claim_heads`` walks them) and by
    priority within a key; ``key_caps`` bounds each key's executing actions per kind, and
    ``cursor`` (kind -> the last key a claim reached) carries the round
    robin from one claim to the next: give the same dict to every claim of one claimer.
    ``reclaims_of``: only these kinds may have leases that ran out (the caller counted them in
    this transaction), so the others' claims skip the reclaim; None looks for every kind.
    ``claimer``: the heartbeat process id of the claimer that pushes what it claims (its claims
    name it, for ``release_lost_claims_operation``); None in process.
    """
    paused: frozenset[str] = frozenset()
    if intake:
        paused = (yield from intake_operation(schema)).paused
    last = cursor if cursor is not None else {}
    claims = kind_claims(
        queries_for(schema),
        limits,
        lease,
        take=take,
        claimer=claimer,
        key_caps=key_caps,
        cursor=last,
        skip=paused,
        reclaims_of=reclaims_of,
        reclaims_only=reclaims_only,
    )
    answers = []
    for claim in claims:
        answers.append((yield claim.statement))
    firsts = settle_first_claims(claims, answers, last)
    claimed = firsts.claimed
    for statement in firsts.fills:
        claimed.extend(claimed_rows((yield statement)))
    return claimed


@dataclass(frozen=True, slots=True)
class KindClaim:
    """One kind's claim: the most it may take, and its first ``claim_heads``."""

    kind: str
    limit: int
    statement: Statement


def kind_claims(
    q: Mapping[str, str],
    limits: Mapping[str, int],
    lease: timedelta,
    *,
    take: bool,
    cursor: Mapping[str, str],
    claimer: str | None = None,
    key_caps: Mapping[str, int] | None = None,
    skip: Collection[str] = (),
    reclaims_of: Collection[str] | None = None,
    reclaims_only: Collection[str] = (),
) -> list[KindClaim]:
    """Each kind's first ``claim_heads`` (``claim_operation`` says what the arguments mean), for
    every kind with a limit that is not in ``skip``: statements a kind, so that each kind's
    bound holds and each is an index range scan. ``claim_operation`` sends them one at a time,
    ``Store.claim`` in one round trip; ``settle_first_claims`` reads their answers."""
    caps = key_caps or {}
    claims = []
    for kind, limit in limits.items():
        if limit <= 0 or kind in skip:
            continue
        reclaim = reclaims_of is None or kind in reclaims_of
        heads = kind not in reclaims_only
        if not (heads or reclaim):
            continue
        params = {"kind": kind, "limit": limit, "lease": lease, "take": take, "claimer": claimer}
        statement = claim_heads_statement(q, params, limit, caps.get(kind), cursor, reclaim, heads)
        claims.append(KindClaim(kind, limit, statement))
    return claims


@dataclass(frozen=True, slots=True)
class FirstClaims:
    """What the kinds' first claims took, and the statements that fill the room some of them
    left (``HeadsClaimed.room_for_more``; ``second_claim_statement``)."""

    claimed: list[ClaimedAction]
    fills: list[Statement]


def settle_first_claims(
    claims: Sequence[KindClaim], answers: Sequence[list[ClaimRow]], cursor: dict[str, str]
) -> FirstClaims:
    """Reads each claim's rows (``answers``, in ``claims`` order): each kind's round robin goes on
    after the last key it walked (``cursor``)."""
    claimed: list[ClaimedAction] = []
    fills: list[Statement] = []
    for claim, rows in zip(claims, answers, strict=True):
        took = heads_claimed(rows, claim.kind, cursor)
        claimed.extend(took.claimed)
        if took.room_for_more(claim.limit):
            fills.append(second_claim_statement(claim.statement, took, claim.limit))
    return FirstClaims(claimed, fills)


def claimed_rows(rows: list[ClaimRow]) -> list[ClaimedAction]:
    """The actions a ``claim_heads`` claimed (a claim that found nothing returns one row of
    NULLs, for its walked keys)."""
    return [claimed for claimed, _, _ in rows if claimed is not None]


def claim_heads_statement(
    q: Mapping[str, str],
    params: Mapping[str, Any],
    left: int,
    key_cap: int | None,
    cursor: Mapping[str, str],
    reclaim: bool = True,
    heads: bool = True,
) -> Statement:
    """The first (often the only) ``claim_heads`` of one kind: up to ``left`` actions, its
    reclaims (unless ``reclaim`` is False), then due heads (unless ``heads`` is False), a fair
    share of each limit key's, walking the keys after the one ``cursor`` holds for the kind.
    ``params``' ``claimer`` (None when it has none) names the claimer in each claim."""
    return Statement(
        q["claim_heads"],
        {
            "claimer": None,
            **params,
            "reclaim": reclaim,
            "heads": heads,
            "keys": None,
            "after": cursor.get(params["kind"], ""),
            "walk": walk_bound(left, key_cap),
            "steps": walk_bound(left, key_cap) + CAPPED_KEYS_PER_CLAIM,
            "per_key": None,
            "limit": left,
            "key_cap": key_cap,
        },
        prepare=True,
        rows=claim_rows,
    )


@dataclass(frozen=True, slots=True)
class HeadsClaimed:
    """What one ``claim_heads`` of a kind took, the limit keys it walked (in order), and whether
    a key took its whole share while its cap left it room for more (``filled``)."""

    claimed: list[ClaimedAction]
    walked: list[str]
    filled: bool = False

    def room_for_more(self, left: int) -> bool:
        """It left room of ``left`` that a key may fill: some keys had fewer due heads than
        their share, and a key that took its whole share may have more (a second pass). Not
        when every key took less than its share (none has more due) or was bound by its cap
        (none has room): a second pass would find nothing."""
        return self.filled and left > len(self.claimed)


def heads_claimed(rows: list[ClaimRow], kind: str, cursor: dict[str, str]) -> HeadsClaimed:
    """Reads a ``claim_heads``'s rows; the kind's round robin goes on after the last key walked."""
    walked: list[str] = (rows[0][1] or []) if rows else []
    if walked:
        cursor[kind] = walked[-1]
    return HeadsClaimed(claimed_rows(rows), walked, bool(rows and rows[0][2]))


def second_claim_statement(first: Statement, took: HeadsClaimed, left: int) -> Statement:
    """The ``claim_heads`` that fills the room ``first`` left of ``left`` (when
    ``took.room_for_more``): over the keys it walked, each up to all that room. Claimed lanes
    are executing now, so nothing is taken twice."""
    left -= len(took.claimed)
    params = first.params or {}
    return Statement(
        first.sql,
        {**params, "reclaim": False, "keys": took.walked, "per_key": left, "limit": left},
        prepare=True,
        rows=claim_rows,
    )


def release_claims_operation(
    schema: str, tokens: Iterable[FenceToken]
) -> Operation[list[FenceToken]]:
    """Gives back claims whose push failed: each still EXECUTING at its token's epoch and not
    taken by a worker becomes ADMITTED and due now. Returns the tokens it gave back."""
    tokens = list(tokens)
    if not tokens:
        return []
    params = {
        "ids": Int8Array([t.action_id for t in tokens]),
        "epochs": Int8Array([t.epoch for t in tokens]),
    }
    rows = yield Statement(queries_for(schema)["release_claims"], params)
    return list(_by_token(rows))


def release_untaken_claims_operation(
    schema: str, kinds: Sequence[str]
) -> Operation[list[FenceToken]]:
    """Gives back every claim of ``kinds`` no worker has taken (the broker that held their
    messages restarted): each becomes ADMITTED and due now. Returns the tokens it gave back."""
    rows = yield Statement(queries_for(schema)["release_untaken_claims"], {"kinds": list(kinds)})
    return list(_by_token(rows))


@dataclass(frozen=True, slots=True)
class LostClaim:
    """An untaken claim given back because its claimer's heartbeat stopped."""

    token: FenceToken
    kind: str
    claimer: str


def release_lost_claims_operation(
    schema: str, claimer: str, silent: timedelta, gap: timedelta
) -> Operation[list[LostClaim]]:
    """Gives back the untaken claims of every other claimer whose heartbeat is older than
    ``silent`` (killed between its claim's commit and its push): each becomes ADMITTED and due
    now. ``claimer``: the caller's own heartbeat process id, whose beats must have run unbroken
    (none more than ``gap`` after the last) for ``silent`` (``outbox_claimer_may_judge``)."""
    params = {"claimer": claimer, "silent": silent, "gap": gap}
    rows = yield Statement(queries_for(schema)["release_claims_of_lost_claimers"], params)
    return [
        LostClaim(FenceToken(row["id"], row["epoch"]), row["kind"], row["claimed_by"])
        for row in rows
    ]


@dataclass(frozen=True, slots=True)
class LostAttempt:
    """A taken, unfenced attempt given back because its worker's heartbeat stopped."""

    token: FenceToken
    kind: str
    worker: str


def release_lost_attempts_operation(
    schema: str, claimer: str, silent: timedelta, within: timedelta, gap: timedelta
) -> Operation[list[LostAttempt]]:
    """Gives back the taken attempts that had not passed their fence of every worker whose
    heartbeat is older than ``silent`` but not than ``within`` (killed between its take and its
    fence): each becomes ADMITTED and due now (retry reason WORKER_LOST), its attempt counted,
    its history row ended (RETRY, WORKER_LOST). ``claimer``: the caller's own heartbeat process
    id, whose beats must have run unbroken (none more than ``gap`` after the last) for
    ``silent`` (``outbox_claimer_may_judge``)."""
    params = {"claimer": claimer, "silent": silent, "within": within, "gap": gap}
    rows = yield Statement(queries_for(schema)["release_attempts_of_lost_workers"], params)
    return [
        LostAttempt(FenceToken(row["id"], row["epoch"]), row["kind"], row["taken_by"])
        for row in rows
    ]


#: A fence a caller asks for: its token, the write margin, the provider reference it records,
#: and the claim's time (starts an in-process attempt's history row).
FenceRequest = tuple[FenceToken, timedelta, str | None, datetime | None]
#: A finish a caller asks for: its token, what it writes, the claim's time (as above),
#: whether this attempt passed its fence (its history row then keeps the fence's time), and the
#: lease of the lane's next action if the caller runs it (the hand-off; None: it does not).
FinishRequest = tuple[FenceToken, Finish, datetime | None, bool, timedelta | None]


@dataclass(frozen=True, slots=True)
class Finished:
    """A finish that was written: ``next`` is the lane's next action, claimed and taken in the
    same statement when the finish handed off, with its payload."""

    next: ClaimedAction | None = None


def _by_token(rows: list[dict[str, Any]]) -> dict[FenceToken, dict[str, Any]]:
    """The rows a batched statement returned, by the token each answers."""
    return {FenceToken(row["id"], row["epoch"]): row for row in rows}


# The parameters of an attempt's statements, one builder a statement, which the warm-up of a
# new connection (``outbox.warmup``) calls too: every parameter has one type whatever its value
# (``outbox.binary_arrays``), so that each statement is one prepared statement a connection, the
# one the warm-up prepared.


def _token_params(token: FenceToken) -> dict[str, Int8]:
    return {"id": Int8(token.action_id), "epoch": Int8(token.epoch)}


def take_params(token: FenceToken, lease: timedelta, taker: str = "") -> dict[str, Any]:
    """``take_attempt``'s. ``taker``: the worker process's heartbeat process id ('' for none:
    always a string, so that the statement is prepared once)."""
    return {**_token_params(token), "lease": lease, "taker": taker}


def takes_params(tokens: Sequence[FenceToken], lease: timedelta, taker: str = "") -> dict[str, Any]:
    """``take_attempts``'."""
    return {
        "ids": Int8Array([t.action_id for t in tokens]),
        "epochs": Int8Array([t.epoch for t in tokens]),
        "lease": lease,
        "taker": taker,
    }


def fence_params(fence: FenceRequest) -> dict[str, Any]:
    """``begin_write``'s."""
    token, margin, ref, claimed_at = fence
    return {**_token_params(token), "margin": margin, "ref": ref, "claimed_at": claimed_at}


def fences_params(fences: Sequence[FenceRequest]) -> dict[str, Any]:
    """``begin_writes``'."""
    return {
        "ids": Int8Array([f[0].action_id for f in fences]),
        "epochs": Int8Array([f[0].epoch for f in fences]),
        "margins": IntervalArray([f[1] for f in fences]),
        "refs": TextArray([f[2] for f in fences]),
        "claimed_ats": TimestamptzArray([f[3] for f in fences]),
    }


def finishes_params(finishes: Sequence[FinishRequest], taker: str = "") -> dict[str, Any]:
    """``finish_many``'s (``taker`` names the worker of a hand-off's take, as ``take_params``)."""
    return {
        "ids": Int8Array([r[0].action_id for r in finishes]),
        "epochs": Int8Array([r[0].epoch for r in finishes]),
        "states": TextArray([r[1].state.value for r in finishes]),
        "stop_reasons": TextArray([r[1].stop_reason for r in finishes]),
        "refs": TextArray([r[1].ref for r in finishes]),
        "retry_reasons": TextArray([r[1].retry_reason for r in finishes]),
        "afters": IntervalArray([r[1].after for r in finishes]),
        "gives_back": BoolArray([r[1].gives_back_attempt for r in finishes]),
        "error_classes": TextArray([r[1].error_class for r in finishes]),
        "claimed_ats": TimestamptzArray([r[2] for r in finishes]),
        "fenced": BoolArray([r[3] for r in finishes]),
        "hand_offs": IntervalArray([r[4] for r in finishes]),
        "retried": BoolArray([r[1].retried for r in finishes]),
        "taker": taker,
    }


def _first(request: tuple[Any, ...]) -> FenceToken:
    token: FenceToken = request[0]
    return token


def _identity(token: FenceToken) -> FenceToken:
    return token


def _log_holds(hold: dict[str, Any]) -> None:
    """One line a kind this process held or released (``provider_outage_hold``'s parameters;
    another process may have held it first, and then this one changed nothing)."""
    for kind, held_for in zip(hold["kinds"], hold["fors"], strict=True):
        if held_for is None:
            log.warning(
                "provider of %s down past OUTBOX_OUTAGE_LIMIT_SECONDS: its claims are no longer"
                " held",
                kind,
                extra={"event": "provider_outage_released", "kind": kind},
            )
        else:
            log.warning(
                "provider of %s down: its claims are held for %.0fs, then one action probes it",
                kind,
                held_for.total_seconds(),
                extra={
                    "event": "provider_outage_held",
                    "kind": kind,
                    "held_for_s": held_for.total_seconds(),
                },
            )


class Store:
    """Runs the executor's operations on an async pool, one short statement at a time."""

    def __init__(
        self,
        pool: AsyncConnectionPool,
        schema: str,
        lease: timedelta,
        outage_rule: OutageRule = DEFAULT_RULE,
    ) -> None:
        self.pool = pool
        self.schema = schema
        #: The lease a worker's take starts afresh (the claimers' lease: one setting).
        self.lease = lease
        #: Per kind, the limit key this store's last claim reached (the round robin's place).
        self.fair_cursor: dict[str, str] = {}
        #: The heartbeat process id this store's takes name ('' for none): a worker process's,
        #: so that a claimer can give its taken, unfenced attempts back once its heartbeat stops
        #: (``outbox.maintenance.lost_workers``).
        self.taker = ""
        #: When a kind's provider counts as down and how long a hold of it lasts: the store
        #: holds a kind its finishes find down (``outbox.provider_outage``), and its exhausting
        #: retries ask it (``provider_down``).
        self.outage_rule = outage_rule
        # Group commit (outbox.batching): concurrent takes, fences and finishes of this
        # process share statements; each row keeps its own epoch check.
        self._take: GroupWriter[FenceToken, FenceToken, ClaimedAction] = GroupWriter(
            "take_attempt", self._take_many, self._take_one, _identity
        )
        self._fence: GroupWriter[FenceRequest, FenceToken, bool] = GroupWriter(
            "begin_write", self._fence_many, self._fence_one, _first
        )
        self._finish: GroupWriter[FinishRequest, FenceToken, Finished] = GroupWriter(
            "finish", self._finish_many, self._finish_one, _first
        )

    @property
    def group_writers(self) -> tuple[GroupWriter[Any, FenceToken, Any], ...]:
        return (self._take, self._fence, self._finish)

    async def _rows(
        self, name: str, params: Mapping[str, Any], rows: Callable[[Any], Any] | None = None
    ) -> list[Any]:
        """One of an attempt's statements (its take, fence or finish), prepared at its first
        run on a connection (``Statement.prepare``); ``rows`` as ``Statement.rows``."""

        def op() -> Operation[list[Any]]:
            return (
                yield Statement(queries_for(self.schema)[name], params, prepare=True, rows=rows)
            )

        return await self.run(op())

    async def _take_one(self, token: FenceToken) -> ClaimedAction | None:
        params = take_params(token, self.lease, self.taker)
        taken: list[ClaimedAction] = await self._rows("take_attempt", params, taken_rows)
        return taken[0] if taken else None

    async def _take_many(self, tokens: Sequence[FenceToken]) -> dict[FenceToken, ClaimedAction]:
        params = takes_params(tokens, self.lease, self.taker)
        taken: list[ClaimedAction] = await self._rows("take_attempts", params, taken_rows)
        return {claimed.action.token: claimed for claimed in taken}

    async def _fence_one(self, fence: FenceRequest) -> bool:
        return bool(await self._rows("begin_write", fence_params(fence)))

    async def _fence_many(self, fences: Sequence[FenceRequest]) -> dict[FenceToken, bool]:
        rows = await self._rows("begin_writes", fences_params(fences))
        return dict.fromkeys(_by_token(rows), True)

    async def _finish_one(self, finish: FinishRequest) -> Finished | None:
        return (await self._finish_many([finish])).get(finish[0])

    async def _finish_many(self, finishes: Sequence[FinishRequest]) -> dict[FenceToken, Finished]:
        # One statement for every finish, one row or many: ends, retries and deferrals alike.
        params = finishes_params(finishes, self.taker)
        rows: dict[FenceToken, FinishRow] = {
            row[0]: row for row in await self._rows("finish_many", params, finish_rows)
        }
        note = outage_note(
            (request[0].action_id, request[1], rows[request[0]][1])
            for request in finishes
            if request[0] in rows
        )
        if note is not None:
            # The finishes are written: a note the database refuses now (it went away, a
            # deadlock) costs an outage row a few retries or a reset, never a finish.
            try:
                hold = holds_called_for(
                    await self._rows("provider_outage_note", note), self.outage_rule
                )
                if hold is not None:
                    await self._rows("provider_outage_hold", hold)
                    _log_holds(hold)
            except (psycopg.Error, OSError) as error:
                log.warning(
                    "provider outage rows not written (%s): the finishes stand",
                    type(error).__name__,
                    extra={"event": "provider_outage_note_failed"},
                )
        return {token: Finished(row[2]) for token, row in rows.items()}

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[AsyncConnection[Any]]:
        token = held_connections.set(held_connections.get() + 1)
        try:
            async with self.pool.connection() as conn:
                yield conn
        finally:
            held_connections.reset(token)

    async def run(self, op: Operation[T]) -> T:
        """Runs ``op`` on a pooled connection, each statement on its own (autocommit)."""
        async with self.connection() as conn:
            return await run_async(conn, op)

    async def claim(
        self,
        limits: Mapping[str, int],
        lease: timedelta,
        *,
        take: bool = True,
        key_caps: Mapping[str, int] | None = None,
        claimer: str | None = None,
    ) -> list[ClaimedAction]:
        """Claims, as ``claim_operation`` does; with ``take`` (an executor in this process runs
        what it claims) it takes at once, without (a claimer that pushes, named by ``claimer``)
        it leaves the take to a worker.

        One round trip (``commit_pipelined``): BEGIN, the fold, each kind's claim and the
        COMMIT, so the claim's transaction holds its lane rows and heads for the server's time
        only, not while this process's event loop, busy with other rounds' attempts, comes back
        to send the next statement (in ``inprocess``, a claim's p50 was 19-20 ms of a 56-60-ms
        round in four round trips, 12-14 ms in one). The fold's statement sets how the claims
        are planned (``lane_intake``); a kind paused or held claims nothing by itself
        (``claim_heads``).
        A kind whose claim left room that a second statement fills (``HeadsClaimed``) gets it in
        a second round trip of the same shape: the first's claims are committed by then, so
        it takes other lanes. If that one fails, the first's claims are still returned (they
        are this process's to run) and the error is logged."""
        q = queries_for(self.schema)
        fold = Statement(q["lane_intake"], {"limit": INTAKE_BATCH})
        claims = kind_claims(
            q, limits, lease, take=take, claimer=claimer, key_caps=key_caps, cursor=self.fair_cursor
        )
        async with self.connection() as conn:
            statements = [fold, *(claim.statement for claim in claims)]
            answers = await commit_pipelined(conn, statements, begin=True)
            firsts = settle_first_claims(claims, answers[1:], self.fair_cursor)
            claimed = firsts.claimed
            if not firsts.fills:
                return claimed
            try:
                answers = await commit_pipelined(conn, [fold, *firsts.fills], begin=True)
            except psycopg.Error as error:
                log.warning(
                    "a second claim statement failed (%s: %s); running the %s claimed",
                    type(error).__name__,
                    error,
                    len(claimed),
                    extra={"event": "second_claim_failed"},
                )
                return claimed
        for rows in answers[1:]:
            claimed.extend(claimed_rows(rows))
        return claimed

    async def take_attempt(self, token: FenceToken) -> ClaimedAction | None:
        """The executing action a message names, if its epoch still holds, at most once per
        epoch: a second delivery of the same token gets None (the Dramatiq actor drops it as
        Abandoned)."""
        return await self._take(token)

    async def begin_write(
        self,
        token: FenceToken,
        margin: timedelta,
        ref: str | None = None,
        claimed_at: datetime | None = None,
    ) -> bool:
        """The fence: marks the write as started while the token's epoch holds and at least
        ``margin`` of the lease is left, and records it (with the provider reference ``ref``, if
        the adapter knows one before its call) in the attempt's history row. ``claimed_at``
        starts that row for an in-process attempt (its claim was its take)."""
        return bool(await self._fence((token, margin, ref, claimed_at)))

    async def finish(
        self,
        token: FenceToken,
        finish: Finish,
        claimed_at: datetime | None = None,
        *,
        fenced: bool = False,
    ) -> bool:
        """Writes ``finish`` (an end or a wait) if the token's epoch still holds, and ends the
        attempt's history row (with its fence's time when ``fenced``: the attempt passed its
        fence); True when it did. ``claimed_at`` as for ``begin_write``."""
        return await self._finish((token, finish, claimed_at, fenced, None)) is not None

    async def finish_and_hand_off(
        self,
        token: FenceToken,
        finish: Finish,
        claimed_at: datetime | None,
        *,
        fenced: bool,
        lease: timedelta,
    ) -> Finished | None:
        """``finish``, and when it ends the action, the lane hand-off in the same statement:
        the lane's next action, if it is due, of the same kind and limit key and not paused,
        claimed and taken under ``lease`` for the caller to run (``Finished.next``). None when
        the finish was not written (the epoch moved)."""
        return await self._finish((token, finish, claimed_at, fenced, lease))

    async def provider_down(self, kind: str) -> bool:
        """Whether ``kind``'s provider is in an outage by ``outage_rule``
        (``outbox.provider_outage``): at least its threshold of distinct actions of the kind
        retried since its last DONE, the first less than its limit ago. Never with a threshold
        of 0 (no query then)."""
        if not self.outage_rule.threshold:
            return False

        def op() -> Operation[bool]:
            rows = yield Statement(queries_for(self.schema)["provider_outages"], {"kind": kind})
            return bool(rows) and self.outage_rule.down(rows[0])

        return await self.run(op())

    async def in_flight(self, kinds: Iterable[str]) -> dict[str, int]:
        """Claimed-and-unfinished actions per kind, with a lease that still runs."""

        def op() -> Operation[dict[str, int]]:
            rows = yield Statement(queries_for(self.schema)["executing_by_kind"])
            return {row["kind"]: row["n"] for row in rows}

        counts = await self.run(op())
        return {kind: counts.get(kind, 0) for kind in kinds}
