"""Overlapping in-process rounds (``Outbox.run_until_idle``, ``drain(concurrency=...)``): every
action runs once, lanes keep their order, rounds and their claims overlap, a key's concurrency
cap holds all the same, and idle means idle."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from outbox import Abandoned, ActionAttempt, ActionKind, ActionRequest, Done, Retry, enqueue
from outbox._io import run_sync
from outbox.limits import KindLimits
from outbox.rounds import run_until_idle
from outbox.store import claim_operation, intake_operation
from outbox.testing import drain

NOTE = ActionKind("NOTE")


class LaneRecorder:
    """Records each lane's attempts in the order they ran (after their fence)."""

    def __init__(self) -> None:
        self.by_lane: dict[str, list[int]] = defaultdict(list)

    async def execute(self, attempt: ActionAttempt) -> Done | Abandoned:
        if not await attempt.fence().begin_write():
            return Abandoned()
        self.by_lane[attempt.lane_key].append(attempt.id)
        await asyncio.sleep(0)
        return Done()


class Gate:
    """Holds each attempt until ``wanted`` attempts run at once (or a few seconds passed), and
    counts the most that ran at once."""

    def __init__(self, wanted: int) -> None:
        self.wanted = wanted
        self.running = 0
        self.most = 0
        self._reached: asyncio.Event | None = None

    async def execute(self, attempt: ActionAttempt) -> Done | Abandoned:
        if not await attempt.fence().begin_write():
            return Abandoned()
        if self._reached is None:
            self._reached = asyncio.Event()
        self.running += 1
        self.most = max(self.most, self.running)
        if self.most >= self.wanted:
            self._reached.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._reached.wait(), 10)
        self.running -= 1
        return Done()


class RetryOnce:
    def __init__(self) -> None:
        self.calls = 0

    async def execute(self, attempt: ActionAttempt) -> Done | Retry | Abandoned:
        if not await attempt.fence().begin_write():
            return Abandoned()
        self.calls += 1
        return Retry() if attempt.attempt == 1 else Done()


def put(ob, database_url, lanes: int, per_lane: int) -> list[int]:
    with psycopg.connect(database_url) as conn:
        ids = [
            enqueue(
                conn,
                ActionRequest(
                    NOTE,
                    workspace_id="w",
                    lane_key=f"lane-{i % lanes}",
                    idempotency_key=f"key-{i}",
                ),
                schema=ob.schema,
            ).id
            for i in range(lanes * per_lane)
        ]
        conn.commit()
    return ids


def build(make_outbox, adapter):
    ob = make_outbox()
    ob.register(NOTE, adapter)
    ob.migrate()
    return ob


async def run(ob, **options):
    async with ob.store() as store:
        return await ob.run_until_idle(ob.executor(store), **options)


def test_overlapping_rounds_run_every_action_once_and_each_lane_in_order(make_outbox, database_url):
    adapter = LaneRecorder()
    ob = build(make_outbox, adapter)
    ids = put(ob, database_url, lanes=5, per_lane=4)

    outcomes = asyncio.run(run(ob, limit=3, concurrency=3))

    assert sorted(o.action_id for o in outcomes) == sorted(ids)
    assert all(o.recorded for o in outcomes)
    assert {lane: sorted(ran) for lane, ran in adapter.by_lane.items()} == adapter.by_lane
    assert sum(len(ran) for ran in adapter.by_lane.values()) == len(ids)


def test_rounds_overlap_up_to_the_concurrency(make_outbox, database_url):
    """A round of one action each: three attempts run at once only if three rounds do."""
    adapter = Gate(wanted=3)
    ob = build(make_outbox, adapter)
    put(ob, database_url, lanes=6, per_lane=1)

    outcomes = asyncio.run(run(ob, limit=1, concurrency=3))

    assert len(outcomes) == 6
    assert adapter.most == 3


def test_a_concurrent_drain_sees_a_retry_through(make_outbox, database_url):
    adapter = RetryOnce()
    ob = build(make_outbox, adapter)
    put(ob, database_url, lanes=4, per_lane=1)

    report = drain(ob, concurrency=3)

    assert report.count() == {"retry": 4, "done": 4}
    assert adapter.calls == 8


def test_concurrency_must_be_positive(make_outbox):
    ob = build(make_outbox, LaneRecorder())
    with pytest.raises(ValueError, match="concurrency"):
        asyncio.run(run(ob, concurrency=0))


def test_a_claim_beside_an_uncommitted_claim_takes_the_next_lanes(make_outbox, database_url):
    """The second claim's scan skips the lanes the first one locked and goes on: it takes as
    many as it asked for, none of the first's."""
    ob = build(make_outbox, LaneRecorder())
    ids = put(ob, database_url, lanes=30, per_lane=1)
    with psycopg.connect(database_url) as conn:
        run_sync(conn, intake_operation(ob.schema))  # the lane rows, committed
        conn.commit()
    lease = ob.settings.lease
    with psycopg.connect(database_url) as first, psycopg.connect(database_url) as second:
        taken_first = run_sync(first, claim_operation(ob.schema, {NOTE.name: 10}, lease, take=True))
        taken_second = run_sync(
            second, claim_operation(ob.schema, {NOTE.name: 10}, lease, take=True)
        )
        first.commit()
        second.commit()

    first_ids = {c.action.id for c in taken_first}
    second_ids = {c.action.id for c in taken_second}
    assert len(first_ids) == len(second_ids) == 10
    assert not first_ids & second_ids
    assert first_ids | second_ids <= set(ids)


class CountingClaims:
    """A claim that waits a moment and counts the most claims running at once."""

    def __init__(self, rounds: int) -> None:
        self.left = rounds
        self.running = 0
        self.most = 0

    async def claim(self) -> int:
        self.running += 1
        self.most = max(self.most, self.running)
        await asyncio.sleep(0.01)
        self.running -= 1
        if self.left <= 0:
            return 0
        self.left -= 1
        return 1

    @staticmethod
    async def run(claimed: int) -> list[int]:
        await asyncio.sleep(0.01)
        return [claimed]


@pytest.mark.parametrize(("claims_overlap", "most"), [(False, 1), (True, 4)])
def test_claims_take_turns_unless_they_may_overlap(claims_overlap, most):
    claims = CountingClaims(rounds=12)
    ran: list[int] = []

    asyncio.run(
        run_until_idle(claims.claim, claims.run, ran.extend, 4, claims_overlap=claims_overlap)
    )

    assert ran == [1] * 12
    assert claims.most == most


class Gauge:
    """Counts the most attempts running at once, in all and of each workspace."""

    def __init__(self) -> None:
        self.running: dict[str, int] = defaultdict(int)
        self.most: dict[str, int] = defaultdict(int)

    async def execute(self, attempt: ActionAttempt) -> Done | Abandoned:
        if not await attempt.fence().begin_write():
            return Abandoned()
        for key in ("all", attempt.action.workspace_id):
            self.running[key] += 1
            self.most[key] = max(self.most[key], self.running[key])
        await asyncio.sleep(0.05)
        for key in ("all", attempt.action.workspace_id):
            self.running[key] -= 1
        return Done()


def test_a_key_cap_holds_across_overlapping_rounds(make_outbox, database_url):
    """Claims of a kind with a key cap take turns: a claim beside another would count the
    key's executing actions without the other's, and each would fill the cap."""
    capped = ActionKind(NOTE.name, limits=KindLimits(key_concurrency=2))
    gauge = Gauge()
    ob = make_outbox()
    ob.register(capped, gauge)
    ob.migrate()
    with psycopg.connect(database_url) as conn:
        for i in range(24):
            enqueue(
                conn,
                ActionRequest(
                    capped, workspace_id=f"w{i % 3}", lane_key=f"lane-{i}", idempotency_key=f"k{i}"
                ),
                schema=ob.schema,
            )
        conn.commit()

    outcomes = asyncio.run(run(ob, limit=10, concurrency=5))

    assert len(outcomes) == 24
    assert max(n for key, n in gauge.most.items() if key != "all") == 2


def test_a_kind_cap_holds_across_overlapping_rounds(make_outbox, database_url):
    """Each round's claim takes only what the kind's cap leaves beside the actions the other
    rounds run."""
    capped = ActionKind(NOTE.name, limits=KindLimits(concurrency=2))
    gauge = Gauge()
    ob = make_outbox()
    ob.register(capped, gauge)
    ob.migrate()
    put(ob, database_url, lanes=20, per_lane=1)

    outcomes = asyncio.run(run(ob, concurrency=5))

    assert len(outcomes) == 20
    assert all(o.recorded for o in outcomes)
    assert gauge.most["all"] == 2


def test_idle_is_not_declared_while_actions_wait_behind_keys_with_only_scheduled_heads(
    make_outbox, database_url
):
    """More workspaces than a claim walks (32) whose only action is scheduled for tomorrow,
    ahead of the workspaces with due actions in key order: the rounds run every due action
    before they call it idle, and leave the scheduled ones waiting."""
    recorder = LaneRecorder()
    ob = build(make_outbox, recorder)
    tomorrow = datetime.now(UTC) + timedelta(days=1)
    with psycopg.connect(database_url) as conn:
        for i in range(40):
            request = ActionRequest(
                NOTE,
                workspace_id=f"a{i:02d}",
                lane_key=f"reminder-{i}",
                idempotency_key=f"reminder-{i}",
                not_before=tomorrow,
            )
            enqueue(conn, request, schema=ob.schema)
        due = [
            enqueue(
                conn,
                ActionRequest(NOTE, workspace_id="w", lane_key=f"due-{i}", idempotency_key=f"d{i}"),
                schema=ob.schema,
            ).id
            for i in range(5)
        ]
        conn.commit()
    outcomes = asyncio.run(run(ob, concurrency=2))
    assert sorted(o.action_id for o in outcomes) == due
    assert sorted(i for ran in recorder.by_lane.values() for i in ran) == due
