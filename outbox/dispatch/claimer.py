"""The claimer: claims due actions in PostgreSQL and pushes their ``FenceToken``s.

Any number of claimers run at once, with no leader. Each round, under a short transaction-scoped
advisory lock (so replicas together keep the bound), it counts each kind's in-flight actions
(EXECUTING with a live lease), claims at most ``in_flight`` minus that many (and at most
``batch_size``), commits, and only then pushes the claimed actions, up to
``actions_per_message`` a message. A claimer that dies between the commit and the push loses
nothing: each claim names its claimer, and another claimer's housekeeping gives back the untaken
claims of one whose heartbeat stopped (``outbox.maintenance.lost_claimers``), or failing that
the action's lease runs out and the next round reclaims it under a new epoch.

No claimer holds up another for long (``claim_guard``: server-side bounds on each round's
transaction), and a broker that stalls or is down never freezes the loop (``pushing``: pushes
run on threads under a timeout; what a failed push carried is given back at once, and no more
is claimed until the broker answers again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from outbox import event_loop, metrics
from outbox._io import Operation, Rows, Statement, run_async
from outbox.connecting import CONNECTION_OPTIONS, one_line, wait_for_database
from outbox.dispatch.claim_guard import ClaimLockBusy, close_claim_round, open_claim_round
from outbox.dispatch.consumption import ConsumptionWatch
from outbox.dispatch.fabric import Fabric, LoopPusher, batches
from outbox.dispatch.heartbeat import Heartbeat
from outbox.dispatch.pushing import BrokerGate, OffLoop, PushTimeout
from outbox.dispatch.restart_watch import RestartWatch
from outbox.fence_token import FenceToken
from outbox.health import ProcessHealth, process_health, start_health_server
from outbox.limits import KindLimits
from outbox.loop_lag import start_watching
from outbox.maintenance import Maintenance
from outbox.queries import queries_for
from outbox.status import describe_enqueue_notify_off, enqueue_notify_off_operation
from outbox.store import (
    INTAKE_BATCH,
    ClaimedAction,
    Intake,
    KindClaim,
    Store,
    claim_heads_statement,
    release_claims_operation,
    release_untaken_claims_operation,
    settle_first_claims,
)

log = logging.getLogger("outbox.claimer")

#: While actions are in flight, their ends free capacity and lane successors without any NOTIFY,
#: so the claimer looks again this often (a count and a claim: a few cheap statements).
BUSY_POLL = 0.05
#: How long after a scheduled head's due time an idle claimer wakes for it: the round's fold
#: promotes the lanes due by its transaction's start, which must come after the due time.
SCHEDULED_SLACK = 0.002
#: Longest single wait, so a stop request is seen promptly even while nothing happens.
WAIT_SLICE = 0.25
#: The claimer's one loop, as its health reports it.
ROUNDS = "claim rounds"


@dataclass
class Round:
    """What one claim round did."""

    claimed: list[ClaimedAction] = field(default_factory=list)
    pushed: int = 0
    #: What each kind whose claims are consumed asked for (probing kinds are not listed).
    limits: dict[str, int] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    #: Lanes this round took off the intake; a full batch means more are waiting.
    folded: int = 0
    #: The kinds not to claim now, as this round read them: paused by an operator, or held by
    #: their provider's outage (``outbox.provider_outage``).
    paused: frozenset[str] = frozenset()
    #: Some kind's claim left room that keys with more due heads than their share could take
    #: (``HeadsClaimed.room_for_more``): the next round claims it, at once.
    room_left: bool = False
    #: Seconds until the soonest scheduled lane head of the claimer's kinds comes due (a
    #: ``not_before``, a back-off), by the database's clock; None when none is scheduled.
    next_due_in: float | None = None

    @property
    def more_due(self) -> bool:
        """Some kind got all it asked for, or left room others could take, or the lane intake
        had more: more may be due now."""
        by_kind: dict[str, int] = {}
        for item in self.claimed:
            by_kind[item.action.kind] = by_kind.get(item.action.kind, 0) + 1
        if self.folded >= INTAKE_BATCH or self.room_left:
            return True
        return any(n and by_kind.get(kind, 0) >= n for kind, n in self.limits.items())

    @property
    def busy(self) -> bool:
        return bool(self.claimed) or any(self.in_flight.values())


def whole_messages(batch_size: int, per_message: int) -> int:
    """The most one round claims of a kind: ``batch_size`` rounded down to whole messages of
    ``per_message`` (96 at 100 and 8), unless it is smaller than one message.

    A worker thread runs one message at a time, so a pool of T threads runs T messages at once:
    a round of 100 went out as 13 messages of 7 or 8 (``batches``), and a pool sized to its
    in-flight bound (T x 8) then held one message more than it had threads, which waited a
    whole provider call for one to come free.
    """
    return batch_size - batch_size % per_message if batch_size >= per_message else batch_size


def pushed_items(claimed: Iterable[ClaimedAction]) -> list[tuple[str, FenceToken]]:
    """What a push carries of each claimed action: its kind (which actor) and its token."""
    return [(c.action.kind, c.action.token) for c in claimed]


@dataclass(frozen=True)
class ClaimPlan:
    """What a claim round decided under the claim lock, from its counts: each kind's claim (the
    claimer sends them together, with the round's COMMIT: ``close_claim_round``), and what the
    round read."""

    claims: list[KindClaim]
    #: What each kind whose claims are consumed asked for (probing kinds are not listed).
    limits: dict[str, int]
    in_flight: dict[str, int]
    folded: int
    paused: frozenset[str]
    probing: frozenset[str]
    #: As ``Round.next_due_in``.
    next_due_in: float | None = None

    @property
    def statements(self) -> list[Statement]:
        return [claim.statement for claim in self.claims]

    def settle(self, answers: list[Rows], watch: ConsumptionWatch, cursor: dict[str, str]) -> Round:
        """The round, from each claim's rows (in ``claims`` order); each kind's round robin goes
        on after the last key its claim walked, and a probe that went out is noted."""
        # A room a claim left is filled by the next round, not by a second statement here.
        firsts = settle_first_claims(self.claims, answers, cursor)
        claimed = firsts.claimed
        for item in claimed:
            if item.action.kind in self.probing:
                watch.probed(item.action.kind, item.action.token)
        return Round(
            claimed=claimed,
            limits=self.limits,
            in_flight=self.in_flight,
            folded=self.folded,
            paused=self.paused,
            room_left=bool(firsts.fills),
            next_due_in=self.next_due_in,
        )


def plan_claim_round(
    schema: str,
    kinds: Iterable[str],
    in_flight: int,
    batch_size: int,
    lease: timedelta,
    watch: ConsumptionWatch,
    kind_limits: Mapping[str, KindLimits] | None = None,
    cursor: Mapping[str, str] | None = None,
    *,
    locked: bool = False,
    claimer: str | None = None,
) -> Operation[ClaimPlan]:
    """Folds the lane intake, counts in-flight and unconsumed claims per kind, and decides each
    kind's claim up to the bound (one probe for a kind whose claims no worker takes); run it in
    a transaction, then the plan's statements in the same one (``bounded_claim_operation``,
    or the claimer's ``close_claim_round``). A kind's concurrency cap (``kind_limits``) lowers
    its bound below ``in_flight``; its per-key cap bounds each limit key's share
    (``claim_heads``). It takes the claim lock first, unless ``locked`` (the transaction took
    it already: ``open_claim_round``). ``claimer``: the claimer's heartbeat process id, which
    its claims name (``outbox.maintenance.lost_claimers``)."""
    kind_limits = kind_limits or {}
    cursor = cursor or {}
    q = queries_for(schema)
    if not locked:
        yield Statement(q["claim_lock"], {"schema": schema})
    # The intake and the counts in one round trip (after the lock: see claim_round_state).
    kinds = list(kinds)
    (state,) = yield Statement(q["claim_round_state"], {"limit": INTAKE_BATCH, "kinds": kinds})
    intake = Intake(int(state["folded"]), frozenset(state["paused"]))
    counts = {row["kind"]: row for row in state["executing"]}
    heads_waiting = frozenset(state["waiting"])
    next_due_in: float | None = state["next_due_in"]
    leases_expired = frozenset(kind for kind, row in counts.items() if int(row["expired"]))
    current: dict[str, int] = {}
    limits: dict[str, int] = {}
    probing: set[str] = set()
    for kind in kinds:
        current[kind] = int(counts[kind]["n"]) if kind in counts else 0
        if kind in intake.paused:
            # An operator paused it, or its provider's outage holds it: no claim, no probe, no
            # reclaim until resumed or the hold ends.
            limits[kind] = 0
            continue
        unconsumed = int(counts[kind]["unconsumed"]) if kind in counts else 0
        if watch.stalled(kind):
            probe = watch.probe(kind)
            if probe is None:
                waiting, expired = unconsumed > 0, True
            else:
                params = {"id": probe.action_id, "epoch": probe.epoch}
                (probed,) = yield Statement(q["probe_state"], params)
                waiting, expired = probed["waiting"], probed["expired"]
            if not waiting:
                watch.resume(kind, in_flight)
            else:
                # Another probe only once this one's lease ran out unconsumed.
                probing.add(kind)
                limits[kind] = 1 if expired else 0
                continue
        elif unconsumed:
            watch.stall(kind, unconsumed, current[kind] + unconsumed)
            probing.add(kind)
            limits[kind] = 1
            continue
        else:
            watch.kept_up(kind, in_flight, current[kind])
        bound = watch.bound(kind, in_flight)
        if kind in kind_limits:
            bound = min(bound, kind_limits[kind].in_flight_bound(in_flight))
        limits[kind] = max(0, min(batch_size, bound - current[kind]))
    claims: list[KindClaim] = []
    for kind, limit in limits.items():
        # No statement for a kind with nothing to claim: no lease ran out and no head waits
        # (what became due meanwhile wakes the next round, or its poll finds it). A probing
        # kind only reclaims; a kind whose leases all hold skips the reclaim.
        reclaim = kind in leases_expired
        heads = kind not in probing
        if limit <= 0 or not (reclaim or (heads and kind in heads_waiting)):
            continue
        cap = kind_limits[kind].key_concurrency if kind in kind_limits else None
        asked = {"kind": kind, "limit": limit, "lease": lease, "take": False, "claimer": claimer}
        statement = claim_heads_statement(q, asked, limit, cap, cursor, reclaim, heads)
        claims.append(KindClaim(kind, limit, statement))
    consumed = {kind: n for kind, n in limits.items() if kind not in probing}
    return ClaimPlan(
        claims=claims,
        limits=consumed,
        in_flight=current,
        folded=intake.folded,
        paused=intake.paused,
        probing=frozenset(probing),
        next_due_in=next_due_in,
    )


def bounded_claim_operation(
    schema: str,
    kinds: Iterable[str],
    in_flight: int,
    batch_size: int,
    lease: timedelta,
    watch: ConsumptionWatch,
    kind_limits: Mapping[str, KindLimits] | None = None,
    cursor: dict[str, str] | None = None,
    *,
    locked: bool = False,
    claimer: str | None = None,
) -> Operation[Round]:
    """A whole claim round's statements (``plan_claim_round``, then each kind's claim, one at a
    time); run it in a transaction. The claimer sends the claims together with its COMMIT
    instead (``Claimer.claim``); what either claims is the same."""
    cursor = cursor if cursor is not None else {}
    plan = yield from plan_claim_round(
        schema,
        kinds,
        in_flight,
        batch_size,
        lease,
        watch,
        kind_limits,
        cursor,
        locked=locked,
        claimer=claimer,
    )
    answers: list[Rows] = []
    for statement in plan.statements:
        answers.append((yield statement))
    return plan.settle(answers, watch, cursor)


class Claimer:
    """One claimer replica for the kinds of ``dispatch`` (a ``Fabric``: Dramatiq's ``Dispatch``
    or Celery's; all its kinds, or ``kinds``)."""

    def __init__(
        self,
        dispatch: Fabric,
        store: Store,
        *,
        kinds: Iterable[str] | None = None,
        health: ProcessHealth | None = None,
    ) -> None:
        self.dispatch = dispatch
        self.store = store
        self.settings = dispatch.outbox.settings
        self.kinds = sorted(kinds if kinds is not None else dispatch.kinds)
        unknown = set(self.kinds) - set(dispatch.kinds)
        if unknown:
            raise ValueError(f"no actor installed for kinds {sorted(unknown)}")
        self._listener: psycopg.AsyncConnection[Any] | None = None
        self.watch = ConsumptionWatch()
        #: The last round's in-flight counts, for the heartbeat.
        self._in_flight_now = 0
        #: Its process id names this claimer in its claims (``agent_action.claimed_by``).
        self.heartbeat = Heartbeat(
            store,
            "claimer",
            self.kinds,
            lambda: self._in_flight_now,
            self.settings.heartbeat_interval.total_seconds(),
        )
        #: Lost claimers' claims, lost leases, expiry, retention and the backlog gauges, each on
        #: its own interval.
        self.maintenance = Maintenance.for_claimer(
            store, self.settings, dispatch.outbox.observers, claimer=self.heartbeat.process_id
        )
        #: Each kind's rate limits and concurrency caps (declared, then OUTBOX_LIMITS).
        self.kind_limits = dispatch.outbox.kind_limits()
        #: Per kind, the limit key the last claim reached: the next starts after it.
        self.fair_cursor: dict[str, str] = {}
        self.off_loop = OffLoop(self.settings.push_timeout.total_seconds())
        #: Pushes from this loop where the fabric can (``Fabric.loop_push``): ``run`` opens it
        #: and closes it when it ends; ``run_once`` alone pushes from a thread.
        self.loop_pusher: LoopPusher | None = None
        self.gate = BrokerGate(dispatch.check_broker, self.off_loop)
        #: Notices a broker that restarted (and lost what it held) to give its claims back.
        self.restart_watch = RestartWatch(dispatch.broker_identity, self.off_loop)
        #: Live while rounds go round; ready while they claim and push (outbox.health).
        self.health = health or ProcessHealth("claimer")
        #: Totals since start, for logs and tests.
        self.totals: dict[str, int] = {
            "claimed": 0,
            "pushed": 0,
            "push_failed": 0,
            "released": 0,
            "released_after_restart": 0,
            "rounds": 0,
            "housekeeping": 0,
        }

    async def claim(self) -> Round:
        """Claims under the bound and commits; nothing is pushed yet."""
        op = plan_claim_round(
            self.store.schema,
            self.kinds,
            self.settings.in_flight,
            whole_messages(self.settings.batch_size, self.settings.actions_per_message),
            self.settings.lease,
            self.watch,
            self.kind_limits,
            self.fair_cursor,
            locked=True,
            claimer=self.heartbeat.process_id,
        )
        # The BEGIN, the guard (bounds and the claim lock) and the round's first statement go
        # in one round trip (``open_claim_round``), then each kind's claim and the COMMIT in
        # another (``close_claim_round``): a round is two round trips, whatever its kinds.
        async with self.store.connection() as conn:
            try:
                rows = await open_claim_round(conn, self.store.schema, self.settings, next(op))
                plan = await run_async(conn, op, started=rows)
                answers = await close_claim_round(conn, plan.statements)
                return plan.settle(answers, self.watch, self.fair_cursor)
            except BaseException:
                with contextlib.suppress(psycopg.Error):  # the session may be gone
                    await conn.rollback()
                raise

    def push_or_unpushed(self, claimed: list[ClaimedAction]) -> list[ClaimedAction]:
        """Pushes the claimed actions (after the claim committed), up to ``actions_per_message``
        a message; returns those whose push failed. Blocking: ``run_once`` runs it off the event
        loop (``push``)."""
        items = pushed_items(claimed)
        try:
            self.dispatch.push_many(items)
            return []
        except Exception as error:
            self._log_pipelined_failure(claimed, error)
        return self.push_one_by_one(claimed)

    def push_one_by_one(self, claimed: list[ClaimedAction]) -> list[ClaimedAction]:
        """After a pipelined push failed, some may have gone: pushed again one message at a time
        (a twin delivery of an epoch is dropped by the worker's take); the first failure ends
        it, as the broker is evidently not answering, and the rest is returned. Blocking."""
        items = pushed_items(claimed)
        by_token = {c.action.token: c for c in claimed}
        messages = batches(items, self.settings.actions_per_message)
        for index, (kind, tokens) in enumerate(messages):
            try:
                self.dispatch.push_batch(kind, tokens)
            except Exception as error:
                log.warning("push failed (%s)", one_line(error))
                return [by_token[token] for _, rest in messages[index:] for token in rest]
        return []

    @staticmethod
    def _log_pipelined_failure(claimed: list[ClaimedAction], error: BaseException) -> None:
        log.warning(
            "pipelined push of %s actions failed (%s); pushing one by one",
            len(claimed),
            one_line(error),
        )

    async def push(self, claimed: list[ClaimedAction]) -> int:
        """Pushes under ``push_timeout``: on the event loop where the fabric can
        (``loop_push``, opened by ``run``), else on a thread. What did not go is given back at
        once (``give_back``) and the broker gate closes. Returns how many actions went."""
        try:
            if self.loop_pusher is not None:
                unpushed = await self._push_on_loop(self.loop_pusher, claimed)
            else:
                unpushed = await self.off_loop.run(self.push_or_unpushed, claimed)
            reason = "a push failed"
        except Exception as error:
            # Timed out (the broker stalls): none is known to have gone.
            unpushed, reason = claimed, one_line(error)
        if unpushed:
            self.totals["push_failed"] += len(unpushed)
            self.gate.close(reason)
            await self.give_back(unpushed)
        return len(claimed) - len(unpushed)

    async def _push_on_loop(
        self, pusher: LoopPusher, claimed: list[ClaimedAction]
    ) -> list[ClaimedAction]:
        """``pusher.push_many`` under ``push_timeout`` (``PushTimeout`` past it); after any
        other failure, one message at a time from a thread, as ``push_or_unpushed``."""
        items = pushed_items(claimed)
        timeout = self.settings.push_timeout.total_seconds()
        try:
            await asyncio.wait_for(pusher.push_many(items), timeout)
            return []
        except TimeoutError:
            raise PushTimeout(f"no answer from the broker within {timeout}s") from None
        except Exception as error:
            self._log_pipelined_failure(claimed, error)
        return await self.off_loop.run(self.push_one_by_one, claimed)

    async def give_back(self, unpushed: list[ClaimedAction]) -> None:
        """Claims whose push failed become due again now (``release_claims``), unless a worker
        took them meanwhile; a failure here leaves them to their lease."""
        tokens = [c.action.token for c in unpushed]
        try:
            released = await self.store.run(release_claims_operation(self.store.schema, tokens))
        except (psycopg.Error, OSError) as error:
            log.warning(
                "giving back %s claims failed (%s); they are reclaimed after their lease",
                len(tokens),
                one_line(error),
            )
            return
        self.totals["released"] += len(released)
        metrics.record_given_back("push_failed", len(released))
        log.warning(
            "gave back %s of %s claims whose push failed (due again now; the rest was taken)",
            len(released),
            len(tokens),
        )

    async def give_back_untaken(self) -> None:
        """The broker restarted: every claim of this claimer's kinds that no worker took is due
        again now (``release_untaken_claims``); a failure here leaves them to their lease."""
        try:
            released = await self.store.run(
                release_untaken_claims_operation(self.store.schema, self.kinds)
            )
        except (psycopg.Error, OSError) as error:
            log.warning(
                "the broker restarted; giving back the claims it held failed (%s): they are "
                "reclaimed after their lease",
                one_line(error),
            )
            return
        self.totals["released_after_restart"] += len(released)
        metrics.record_given_back("broker_restarted", len(released))
        log.warning(
            "the broker restarted and lost the messages it held; gave back %s claims no worker "
            "had taken (due again now)",
            len(released),
            extra={"event": "broker_restarted", "released": len(released)},
        )

    async def housekeep_if_due(self) -> None:
        """The maintenance services whose turn came (bounded; a failing one waits its next)."""
        if await self.maintenance.run_due():
            self.totals["housekeeping"] += 1

    async def housekeep(self, stop: asyncio.Event) -> None:
        """``housekeep_if_due`` until ``stop``, beside the rounds (``run``): a woken round never
        waits for the maintenance statements (tens of ms every ``housekeeping_interval``,
        which were the slowest rounds' latency). Each turn looks again after at most
        ``WAIT_SLICE``; the services keep their own intervals."""
        while not stop.is_set():
            await self.housekeep_if_due()  # a failing service is logged and waits its turn
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=WAIT_SLICE)

    async def run_once(self, *, housekeeping: bool = True) -> Round:
        """Housekeeping when due (unless ``housekeeping`` is False: ``run`` does it beside the
        rounds), one bounded claim, then the pushes."""
        if housekeeping:
            await self.housekeep_if_due()
        was_open = self.gate.open
        if not await self.gate.ready():
            # The broker does not answer: nothing is claimed that could not be pushed.
            self.totals["rounds"] += 1
            return Round()
        # Answering again after a failed push is when a restart is likeliest: look at once.
        if await self.restart_watch.restarted(now=not was_open):
            await self.give_back_untaken()
        result = await self.claim()
        self._in_flight_now = sum(result.in_flight.values()) + len(result.claimed)
        if result.claimed:
            result.pushed = await self.push(result.claimed)
        self.totals["rounds"] += 1
        self.totals["claimed"] += len(result.claimed)
        self.totals["pushed"] += result.pushed
        return result

    async def run(self, stop: asyncio.Event) -> None:
        """Rounds until ``stop`` is set; a round in progress (its claim and pushes) finishes."""
        log.info(
            "claimer started: kinds %s, in-flight bound %s, lease %ss, %s",
            ", ".join(self.kinds),
            self.settings.in_flight,
            self.settings.lease.total_seconds(),
            event_loop.loop_name(asyncio.get_running_loop()),
        )
        self.loop_pusher = self.dispatch.loop_push()
        # Its row exists before its first claim: a claim whose claimer has no row (one that
        # stopped cleanly) is never taken for a lost claimer's.
        await self.heartbeat.beat()
        await self._report_quiet_enqueues()
        beating = asyncio.Event()
        heartbeat = asyncio.create_task(self.heartbeat.run(beating))
        housekeeping = asyncio.create_task(self.housekeep(beating))
        try:
            while not stop.is_set():
                wait = self.settings.poll_interval.total_seconds()
                try:
                    result = await self.run_once(housekeeping=False)
                    if self.gate.open:
                        self.health.ok(ROUNDS)
                    else:
                        self.health.trouble(ROUNDS, "the broker does not take pushes")
                    if result.more_due:
                        continue
                    if result.busy:
                        wait = min(wait, BUSY_POLL)
                    if result.next_due_in is not None:
                        # Wake as the soonest scheduled head comes due, not at the next poll;
                        # one due already was passed over by the fold (another transaction
                        # held its lane row): look again at the busy pace, not in a spin.
                        due_in = result.next_due_in
                        wait = min(wait, due_in + SCHEDULED_SLACK if due_in > 0 else BUSY_POLL)
                except ClaimLockBusy:
                    wait = BUSY_POLL  # logged; the holder's session ends soon
                    self.health.beat(ROUNDS)
                except psycopg.OperationalError as error:
                    # The server ended the session (e.g. this claimer sat idle inside its round
                    # past claim_idle_timeout) or the connection broke.
                    log.warning("claim round failed (%s); trying again", one_line(error))
                    self.health.trouble(ROUNDS, f"PostgreSQL: {one_line(error)}")
                except (psycopg.Error, OSError) as error:
                    log.exception("claim round failed; trying again")
                    self.health.trouble(ROUNDS, f"claim round failed: {one_line(error)}")
                await self.wait(wait, stop)
        finally:
            beating.set()
            await heartbeat
            await housekeeping
            await self._close_listener()
            await self._close_loop_pusher()
            self.off_loop.close()
            log.info("claimer stopped: %s", self.totals)

    async def _report_quiet_enqueues(self) -> None:
        """Says at start when the enqueues of a role or a database send no NOTIFY
        (``outbox.enqueue_notify`` off): this claimer finds their actions at its poll only. A
        failed look is logged and passed over: it informs, it guards nothing."""
        try:
            quiet = await self.store.run(enqueue_notify_off_operation(self.store.schema))
        except psycopg.Error as error:
            log.warning("could not read outbox.enqueue_notify's defaults (%s)", one_line(error))
            return
        said = describe_enqueue_notify_off(quiet)
        if said:
            log.info(
                "%s: every %ss here",
                said,
                self.settings.poll_interval.total_seconds(),
                extra={"event": "enqueue_notify_off"},
            )

    async def wait(self, timeout: float, stop: asyncio.Event) -> None:
        """Until an enqueue NOTIFY, ``timeout`` seconds, or ``stop``; polling if LISTEN fails."""
        deadline = time.monotonic() + timeout
        while not stop.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            listener = await self._ensure_listener()
            if listener is None:
                await asyncio.sleep(min(left, WAIT_SLICE))
                continue
            try:
                woke = False
                async for _ in listener.notifies(timeout=min(left, WAIT_SLICE), stop_after=1):
                    woke = True
                if woke:
                    # One round serves every enqueue that came in meanwhile.
                    async for _ in listener.notifies(timeout=0):
                        pass
                    return
            except psycopg.Error:
                log.warning("LISTEN connection lost; polling until it is back")
                await self._close_listener()

    async def _ensure_listener(self) -> psycopg.AsyncConnection[Any] | None:
        if self._listener is not None and not self._listener.closed:
            return self._listener
        try:
            conn = await psycopg.AsyncConnection.connect(
                self.settings.require_database_url(), autocommit=True, **CONNECTION_OPTIONS
            )
            channel = sql.Identifier(f"outbox_{self.store.schema}")
            query = sql.SQL(queries_for(self.store.schema)["listen_enqueues"])
            await conn.execute(query.format(channel=channel))
        except psycopg.Error:
            return None
        self._listener = conn
        return conn

    async def _close_loop_pusher(self) -> None:
        pusher, self.loop_pusher = self.loop_pusher, None
        if pusher is not None:
            with contextlib.suppress(Exception):  # a broker gone meanwhile: nothing to close
                await pusher.aclose()

    async def _close_listener(self) -> None:
        if self._listener is not None:
            await self._listener.close()
            self._listener = None


async def run_claimer_async(
    dispatch: Fabric, *, kinds: Iterable[str] | None = None, stop: asyncio.Event | None = None
) -> Mapping[str, int]:
    """Runs one claimer until SIGTERM or SIGINT (or ``stop``); returns its totals."""
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    settings = dispatch.outbox.settings
    port = settings.metrics_port
    server = metrics.start_metrics_server(port) if port else None
    health = process_health("claimer", settings)
    health.publish()
    health_server = (
        start_health_server(health.verdict, settings.health_port, settings.health_host)
        if settings.health_port
        else None
    )
    lag = start_watching("claimer")
    try:
        # PostgreSQL and the broker are waited for (with backoff, each wait logged), and a
        # stop request ends either wait at once.
        url = dispatch.outbox.settings.require_database_url()
        if not await wait_for_database(url, log, stop):
            log.info("claimer stopped before it started: PostgreSQL never answered")
            return {}
        async with dispatch.outbox.store() as store:
            claimer = Claimer(dispatch, store, kinds=kinds, health=health)
            if not await claimer.gate.wait_until_up(stop):
                claimer.off_loop.close()
                log.info("claimer stopped before it started: the broker never answered")
                return claimer.totals
            await claimer.run(stop)
            return claimer.totals
    finally:
        lag.cancel()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        for serving in (server, health_server):
            if serving is not None:
                serving.shutdown()
                serving.server_close()
        health.close()
        metrics.mark_process_dead()


def run_claimer(dispatch: Fabric, *, kinds: Iterable[str] | None = None) -> Mapping[str, int]:
    """The sync entry of ``outbox claimer``."""
    return event_loop.run(
        run_claimer_async(dispatch, kinds=kinds), dispatch.outbox.settings.event_loop
    )
