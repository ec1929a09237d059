"""``Outbox``: the object an application builds once and registers kinds and adapters on."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool

from outbox import enqueuing as _enqueue
from outbox import rounds
from outbox.action import Action
from outbox.adapter import ActionAdapter
from outbox.config import Settings
from outbox.connecting import CONNECTION_OPTIONS
from outbox.errors import AdapterAlreadyRegistered, KindConflictError
from outbox.executor import ActionExecutor, Outcome
from outbox.kinds import BUILTIN_KINDS, ActionKind
from outbox.limits import KindLimits, effective_limits
from outbox.metrics import MetricsObserver
from outbox.migrate import MigrationReport, migrate
from outbox.observers import ExecutorObserver, LogObserver
from outbox.request import ActionRequest
from outbox.store import ClaimedAction, Store
from outbox.warmup import use_generic_plans, warm_connection


def default_observers() -> list[ExecutorObserver]:
    """What every executor reports to unless told otherwise: the metrics, then the logs."""
    return [MetricsObserver(), LogObserver()]


class Outbox:
    """Settings, the declared kinds, and exactly one adapter per kind (in processes that run them).

    ``Outbox(database_url, lease=timedelta(minutes=2))``; anything not given comes from the
    environment (``OUTBOX_*``, see ``Settings``).
    """

    def __init__(
        self, database_url: str | None = None, *, settings: Settings | None = None, **overrides: Any
    ) -> None:
        base = settings or Settings.from_env()
        self.settings = base.with_overrides(database_url=database_url, **overrides)
        self.kinds: dict[str, ActionKind] = {k.name: k for k in BUILTIN_KINDS}
        self.adapters: dict[str, ActionAdapter] = {}
        #: What this outbox's executors report to (``outbox.observers``): metrics and logs by
        #: default; append an ``ExecutorObserver`` to hear of every attempt and end as well.
        self.observers: list[ExecutorObserver] = default_observers()

    @property
    def schema(self) -> str:
        return self.settings.schema

    def declare(self, *kinds: ActionKind) -> None:
        """Declares kinds this application enqueues (``outbox migrate`` writes them)."""
        for kind in kinds:
            known = self.kinds.get(kind.name)
            if known is not None and known != kind:
                raise KindConflictError(f"kind {kind.name} declared as {known} and as {kind}")
            self.kinds[kind.name] = kind

    def kind_limits(self) -> dict[str, KindLimits]:
        """Each limited kind's rate limits and concurrency caps: what the kind declares, with
        ``OUTBOX_LIMITS`` (``settings.limits``) on top (docs/limits.md)."""
        declared = {name: kind.limits for name, kind in self.kinds.items() if kind.limits}
        return effective_limits(declared, self.settings.limits)

    def register(self, kind: ActionKind, adapter: ActionAdapter) -> None:
        """Declares ``kind`` and makes ``adapter`` its one adapter in this process."""
        if kind.name in self.adapters:
            raise AdapterAlreadyRegistered(
                f"kind {kind.name} already has adapter {self.adapters[kind.name]!r}"
            )
        if not callable(getattr(adapter, "execute", None)):
            raise TypeError(f"{adapter!r} has no execute(attempt) method")
        self.declare(kind)
        self.adapters[kind.name] = adapter

    # -- schema --------------------------------------------------------------------------------

    def migrate(self, conn: psycopg.Connection[Any] | None = None) -> MigrationReport:
        """Applies pending migrations and declares this outbox's kinds; commits."""
        if conn is not None:
            return migrate(conn, self.schema, self.kinds.values())
        with psycopg.connect(self.settings.require_database_url()) as own:
            return migrate(own, self.schema, self.kinds.values())

    # -- the application's side, in its transaction ----------------------------------------------

    def enqueue(self, conn: Any, request: ActionRequest) -> Action:
        return _enqueue.enqueue(
            conn, request, schema=self.schema, max_payload_bytes=self.settings.max_payload_bytes
        )

    async def enqueue_async(self, conn: Any, request: ActionRequest) -> Action:
        return await _enqueue.enqueue_async(
            conn, request, schema=self.schema, max_payload_bytes=self.settings.max_payload_bytes
        )

    def enqueue_many(self, conn: Any, requests: Sequence[ActionRequest]) -> list[Action]:
        return _enqueue.enqueue_many(
            conn, requests, schema=self.schema, max_payload_bytes=self.settings.max_payload_bytes
        )

    async def enqueue_many_async(
        self, conn: Any, requests: Sequence[ActionRequest]
    ) -> list[Action]:
        return await _enqueue.enqueue_many_async(
            conn, requests, schema=self.schema, max_payload_bytes=self.settings.max_payload_bytes
        )

    def admit(self, conn: Any, action_id: int) -> Action:
        return _enqueue.admit(conn, action_id, schema=self.schema)

    def refuse(self, conn: Any, action_id: int, reason: str | None = None) -> Action:
        return _enqueue.refuse(conn, action_id, reason, schema=self.schema)

    async def admit_async(self, conn: Any, action_id: int) -> Action:
        return await _enqueue.admit_async(conn, action_id, schema=self.schema)

    async def refuse_async(self, conn: Any, action_id: int, reason: str | None = None) -> Action:
        return await _enqueue.refuse_async(conn, action_id, reason, schema=self.schema)

    def get(self, conn: Any, action_id: int) -> Action | None:
        return _enqueue.get_action(conn, action_id, schema=self.schema)

    # -- the executing side ---------------------------------------------------------------------

    def _store(self, pool: AsyncConnectionPool) -> Store:
        return Store(pool, self.schema, self.settings.lease, self.settings.outage_rule)

    @asynccontextmanager
    async def store(
        self, pool: AsyncConnectionPool | None = None, *, generic_plans: bool = False
    ) -> AsyncIterator[Store]:
        """A ``Store`` on ``pool``, or on a pool of its own (autocommit) closed on exit.

        ``generic_plans``: the pool's sessions plan each prepared statement once
        (``plan_cache_mode = force_generic_plan``), for a pool that runs attempts' statements
        and small lookups only (a worker's): an attempt's take, fence and finish are written to
        be planned so (``docs/benchmarks.md``), and PostgreSQL's own choice planned each of them
        anew for their first runs on every connection, and for most runs of a batch. It sets
        up the sessions of the pool the store opens: a pool of the caller's (``pool``) plans so
        when its connections are made with ``options="-c plan_cache_mode=force_generic_plan"``,
        and asking for it beside one raises ``ValueError`` rather than being ignored."""
        if pool is not None:
            if generic_plans:
                raise ValueError(
                    "generic_plans sets up the sessions of the pool the store opens; for a pool"
                    " of your own, make its connections with"
                    " options='-c plan_cache_mode=force_generic_plan'"
                )
            yield self._store(pool)
            return
        schema, lease = self.schema, self.settings.lease

        async def warm(conn: psycopg.AsyncConnection[Any]) -> None:
            if generic_plans:
                await use_generic_plans(conn)
            await warm_connection(conn, schema, lease)

        own = AsyncConnectionPool(
            self.settings.require_database_url(),
            min_size=1,
            max_size=self.settings.pool_size,
            kwargs={"autocommit": True, **CONNECTION_OPTIONS},
            configure=warm,
            open=False,
        )
        await own.open(wait=True)
        try:
            yield self._store(own)
        finally:
            await own.close()

    def executor(self, store: Store) -> ActionExecutor:
        read_back = {name for name, kind in self.kinds.items() if not kind.at_most_once}
        return ActionExecutor(
            store,
            self.adapters,
            self.settings,
            self.observers,
            self.kind_limits(),
            read_back_kinds=read_back,
        )

    async def claim_and_run(
        self, executor: ActionExecutor, kinds: Iterable[str] | None = None, limit: int | None = None
    ) -> list[Outcome]:
        """One round in-process: claim due actions of ``kinds`` (default: those with an adapter
        here) and run them all concurrently. Returns what each attempt came to."""
        return await self._run_claimed(executor, await self._claim(executor, kinds, limit))

    async def run_until_idle(
        self,
        executor: ActionExecutor,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
        *,
        concurrency: int = 1,
    ) -> list[Outcome]:
        """``claim_and_run`` rounds until a claim finds nothing while no other round claims or
        runs; returns every attempt's outcome, in the order the rounds ended.

        ``concurrency`` rounds overlap on the executor's pool: one claims while others fence
        and finish, and their fences and finishes share group-commit statements
        (``outbox.rounds``); their claims overlap too unless a kind has a concurrency cap. Keep
        it below the pool's size (``pool_size``): each round holds a connection while it
        claims, and each sort of group-commit statement one.
        """
        outcomes: list[Outcome] = []
        names = list(kinds) if kinds is not None else None
        await rounds.run_until_idle(
            lambda: self._claim(executor, names, limit),
            lambda claim: self._run_claimed(executor, claim),
            outcomes.extend,
            concurrency,
            claimed=lambda claim: bool(claim[1]),
            claims_overlap=self._claims_may_overlap(names),
        )
        return outcomes

    def _claims_may_overlap(self, kinds: Iterable[str] | None) -> bool:
        """Whether in-process claims of ``kinds`` (default: those with an adapter here) may run
        at once: not when one of them has a concurrency cap, which a claim checks against the
        executing actions it reads, and a claim beside it has not committed yet."""
        kind_limits = self.kind_limits()
        for name in kinds if kinds is not None else self.adapters:
            limits = kind_limits.get(name)
            if limits is not None and (
                limits.concurrency is not None or limits.key_concurrency is not None
            ):
                return False
        return True

    async def _claim(
        self, executor: ActionExecutor, kinds: Iterable[str] | None, limit: int | None
    ) -> tuple[float, list[ClaimedAction]]:
        """Claims (and so takes) due actions of ``kinds``; with ``time.monotonic()`` from before
        the claim, which the attempts' deadlines count from. A kind with a concurrency cap
        claims no more than the cap leaves beside its executing actions (rounds of this
        process claim in turn then, ``_claims_may_overlap``, so each counts the others')."""
        names = list(kinds) if kinds is not None else list(self.adapters)
        per_kind = limit or self.settings.batch_size
        kind_limits = self.kind_limits()
        bounds = {}
        caps = {}
        for name in names:
            limits = kind_limits.get(name)
            bounds[name] = per_kind if limits is None else limits.in_flight_bound(per_kind)
            if limits is not None and limits.concurrency is not None:
                caps[name] = limits.concurrency
        if caps:
            executing = await executor.store.in_flight(caps)
            for name, cap in caps.items():
                bounds[name] = min(bounds[name], max(0, cap - executing[name]))
        key_caps = {
            name: limits.key_concurrency
            for name, limits in kind_limits.items()
            if limits.key_concurrency is not None
        }
        claimed_at = time.monotonic()
        claimed = await executor.store.claim(bounds, self.settings.lease, key_caps=key_caps)
        return claimed_at, claimed

    @staticmethod
    async def _run_claimed(
        executor: ActionExecutor, claim: tuple[float, list[ClaimedAction]]
    ) -> list[Outcome]:
        claimed_at, claimed = claim
        return list(await asyncio.gather(*(executor.run(c, claimed_at) for c in claimed)))
