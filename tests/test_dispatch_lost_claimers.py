"""A claimer killed between its claim's commit and its push: its claims name it, and another
claimer gives back those no worker took once its heartbeat has been silent for three heartbeat
intervals, instead of leaving them to their lease (outbox.maintenance.lost_claimers)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from dispatch_support import JUDGES, DispatchRig, app_schema, heartbeat_row, judge_row
from fault_support import fault_rig
from prometheus_client import REGISTRY

from outbox.fence_token import FenceToken
from outbox.maintenance.lost_claimers import LostClaimers
from outbox.maintenance.runner import Maintenance
from outbox.status import inspect, render_inspect

#: A lease far longer than the tests wait: what ends in time was given back, not reclaimed.
LONG_LEASE = {
    "OUTBOX_LEASE_SECONDS": "60",
    "OUTBOX_WRITE_MARGIN_SECONDS": "1",
    "OUTBOX_HEARTBEAT_INTERVAL_SECONDS": "1",
}


@pytest.fixture
def rig(database_url: str, schema: str, redis_url: str) -> Iterator[DispatchRig]:
    with fault_rig(database_url, schema, redis_url, **LONG_LEASE) as rig:
        yield rig


def _given_back() -> float:
    labels = {"reason": "claimer_lost"}
    return REGISTRY.get_sample_value("outbox_claims_given_back_total", labels) or 0.0


def test_claims_of_a_claimer_killed_before_its_push_run_within_seconds_not_a_lease(
    rig: DispatchRig,
) -> None:
    stalled = rig.claimer(DISPATCH_APP_STALL_PUSH="1")
    ids = rig.enqueue(rig.rb, lanes=6, per_lane=1)
    rig.wait_rows("dispatch_stall", 1)  # a claim committed; its push never happens
    with rig.connect() as conn:
        held = [r["id"] for r in rig.actions(conn, ids) if r["state"] == "EXECUTING"]
    assert held, "nothing was claimed"
    stalled.kill()
    killed = time.monotonic()

    rig.worker(threads=4)
    claimer = rig.claimer()
    rows = rig.wait_ended(ids, timeout=20)  # the lease is 60 s
    print(f"\n{len(held)} lost claims ended {time.monotonic() - killed:.1f}s after the kill")
    assert {r["state"] for r in rows} == {"DONE"}
    by_id = {r["id"]: r for r in rows}
    # Given back unrun: no attempt spent; claimed again under a new epoch.
    assert all((by_id[i]["attempt"], by_id[i]["epoch"]) == (1, 2) for i in held)
    assert sorted((c["action_id"], c["epoch"]) for c in rig.calls() if c["action_id"] in held) == [
        (i, 2) for i in sorted(held)
    ]
    output = claimer.output()
    assert "has been silent for over 3s; gave back" in output, output
    assert f"gave back {len(held)} of its claims" in output, output


@pytest.fixture
def store_rig(database_url: str, schema: str) -> DispatchRig:
    return app_schema(database_url, schema)


def _heartbeat(conn: psycopg.Connection[Any], process_id: str, silent_for: float) -> None:
    heartbeat_row(conn, process_id, "claimer", silent_for)


async def test_only_untaken_claims_of_claimers_silent_past_three_beats_are_given_back(
    store_rig: DispatchRig, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    outbox, kind = store_rig.outbox(), store_rig.rb
    lease = timedelta(seconds=60)
    await asyncio.to_thread(store_rig.enqueue, kind, lanes=9, per_lane=1)
    async with outbox.store() as store:
        lost = await store.claim({kind: 3}, lease, take=False, claimer="lost")
        live = await store.claim({kind: 2}, lease, take=False, claimer="live")
        stopped = await store.claim({kind: 2}, lease, take=False, claimer="stopped-cleanly")
        mine = await store.claim({kind: 1}, lease, take=False, claimer="me")
        ran = await store.claim({kind: 1}, lease, take=True)
        taken = lost[0].action.token
        assert await store.take_attempt(taken) is not None
        with psycopg.connect(outbox.settings.require_database_url(), autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            _heartbeat(conn, "lost", 16)
            _heartbeat(conn, "live", 2)
            judge_row(conn)  # beating all along, it never gives back its own claims
            # "stopped-cleanly" took its row away: it pushed what it claimed.
            names = dict(conn.execute("SELECT id, claimed_by FROM agent_action").fetchall())
        assert names[ran[0].action.id] is None, "an in-process claim names no claimer"
        assert {names[c.action.id] for c in lost} == {"lost"}

        counted = _given_back()
        service = LostClaimers(timedelta(0), "me", heartbeat_interval=timedelta(seconds=5))
        with caplog.at_level(logging.WARNING, logger="outbox.claimer"):
            assert await service.run(store) == 2
        assert await service.run(store) == 0, "given back once"
        assert _given_back() == counted + 2
        [record] = [r for r in caplog.records if getattr(r, "event", "") == "claimer_lost"]
        assert (record.claimer, record.released) == ("lost", 2)  # type: ignore[attr-defined]

        given_back = {c.action.id: c.action.epoch for c in lost[1:]}
        kept = [c.action.id for c in [lost[0], *live, *stopped, *mine]]
        with psycopg.connect(outbox.settings.require_database_url(), autocommit=True) as conn:
            rows = {
                row[0]: row[1:]
                for row in conn.execute(
                    f'SELECT id, state, epoch, attempt, lease_until FROM "{schema}".agent_action'
                )
            }
        for action_id, epoch in given_back.items():
            assert rows[action_id] == ("ADMITTED", epoch, 0, None)
        assert {rows[i][0] for i in kept} == {"EXECUTING"}

        # Claimed again under a new epoch; a message of the old one finds nothing to take.
        again = await store.claim({kind: 9}, lease, take=False, claimer="me")
        assert {c.action.id: c.action.epoch for c in again} == {
            i: e + 1 for i, e in given_back.items()
        }
        for action_id, epoch in given_back.items():
            assert await store.take_attempt(FenceToken(action_id, epoch)) is None


async def test_a_claimers_housekeeping_gives_back_lost_claims_other_housekeeping_does_not(
    store_rig: DispatchRig,
) -> None:
    outbox = store_rig.outbox()
    async with outbox.store() as store:
        claimer = Maintenance.for_claimer(store, outbox.settings, claimer="me")
        assert "lost_claimers" in claimer.turns
        assert "lost_claimers" not in Maintenance.for_claimer(store, outbox.settings).turns
        [service] = [s for s in claimer.services if isinstance(s, LostClaimers)]
        assert service.silent == outbox.settings.heartbeat_interval * 3


@pytest.mark.parametrize(("judge_silent_for", "judge_beating_for", "given_back"), JUDGES)
async def test_only_a_claimer_beating_unbroken_for_the_silence_gives_back_claims(
    store_rig: DispatchRig,
    schema: str,
    judge_silent_for: float,
    judge_beating_for: float,
    given_back: int,
) -> None:
    """A database outage silences every claimer: one judges another lost only while its own
    beats have run unbroken (none later than 1.5 intervals) for as long as the silence."""
    outbox, kind = store_rig.outbox(), store_rig.rb
    await asyncio.to_thread(store_rig.enqueue, kind, lanes=2, per_lane=1)
    async with outbox.store() as store:
        await store.claim({kind: 2}, timedelta(seconds=60), take=False, claimer="quiet")
        with psycopg.connect(store_rig.database_url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            _heartbeat(conn, "quiet", 16)
            heartbeat_row(conn, "me", "claimer", judge_silent_for, judge_beating_for)
        service = LostClaimers(timedelta(0), "me", heartbeat_interval=timedelta(seconds=5))
        assert await service.run(store) == given_back


async def test_inspect_names_the_claimer_of_an_executing_action(
    store_rig: DispatchRig, schema: str
) -> None:
    outbox, kind = store_rig.outbox(), store_rig.rb
    await asyncio.to_thread(store_rig.enqueue, kind, lanes=2, per_lane=1)
    lease = timedelta(seconds=60)
    async with outbox.store() as store:
        [pushed] = await store.claim({kind: 1}, lease, take=False, claimer="host:42:1700000000000")
        [ran] = await store.claim({kind: 1}, lease, take=True)
    with psycopg.connect(store_rig.database_url) as conn:
        claimed = inspect(conn, pushed.action.id, schema=schema)
        in_process = inspect(conn, ran.action.id, schema=schema)
    assert claimed is not None and in_process is not None
    assert claimed["claimed_by"] == "host:42:1700000000000"
    assert "claimed by: host:42:1700000000000" in render_inspect(claimed)
    assert in_process["claimed_by"] is None
    assert "claimed by" not in render_inspect(in_process)


async def test_a_give_back_racing_the_workers_takes_leaves_each_claim_taken_or_given_back(
    store_rig: DispatchRig, schema: str
) -> None:
    """Workers take a lost claimer's claims (their messages did reach the broker) while another
    claimer gives them back: each ends up either taken (and runs) or given back (and is claimed
    again), never both, never neither."""
    outbox, kind = store_rig.outbox(), store_rig.rb
    await asyncio.to_thread(store_rig.enqueue, kind, lanes=60, per_lane=1)
    lease = timedelta(seconds=60)
    async with outbox.store() as store:
        claimed = await store.claim({kind: 60}, lease, take=False, claimer="lost")
        assert len(claimed) == 60
        with psycopg.connect(store_rig.database_url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            _heartbeat(conn, "lost", 16)
            judge_row(conn)
        service = LostClaimers(timedelta(0), "me", heartbeat_interval=timedelta(seconds=5))
        tokens = [c.action.token for c in claimed]
        # Half the takes go in before the give-back starts, the rest race it.
        early = await asyncio.gather(*(store.take_attempt(t) for t in tokens[::2]))
        racing, given_back = await asyncio.gather(
            asyncio.gather(*(store.take_attempt(t) for t in tokens[1::2])),
            service.run(store),
        )
    taken = {
        t.action_id
        for t, got in zip([*tokens[::2], *tokens[1::2]], [*early, *racing], strict=True)
        if got
    }
    assert {t.action_id for t in tokens[::2]} <= taken
    with psycopg.connect(store_rig.database_url) as conn:
        rows = {
            row[0]: row[1:]
            for row in conn.execute(
                f'SELECT id, state, taken_epoch = epoch FROM "{schema}".agent_action'
            )
        }
    assert len(taken) + given_back == 60
    for token in tokens:
        state, was_taken = rows[token.action_id]
        if token.action_id in taken:
            assert (state, was_taken) == ("EXECUTING", True)
        else:
            assert state == "ADMITTED" and not was_taken
