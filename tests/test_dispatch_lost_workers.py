"""A worker killed between its take and its fence: its takes name it, and a claimer gives back
its taken, unfenced attempts once its heartbeat has been silent for three heartbeat intervals,
instead of leaving them to their lease (outbox.maintenance.lost_workers). An attempt that passed
its fence is never given back, and a worker that only stalled finds its fence refused."""

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

from outbox.maintenance.lost_processes import report_given_back
from outbox.maintenance.lost_workers import LostWorkers
from outbox.maintenance.runner import Maintenance
from outbox.results import Finish
from outbox.state import ActionState
from outbox.status import inspect, render_inspect

#: A lease far longer than the tests wait: what runs again in time was given back, not reclaimed.
LONG_LEASE = {
    "OUTBOX_LEASE_SECONDS": "60",
    "OUTBOX_WRITE_MARGIN_SECONDS": "1",
    "OUTBOX_HEARTBEAT_INTERVAL_SECONDS": "1",
}
LEASE = timedelta(seconds=60)


@pytest.fixture
def rig(database_url: str, schema: str, redis_url: str) -> Iterator[DispatchRig]:
    with fault_rig(database_url, schema, redis_url, **LONG_LEASE) as rig:
        yield rig


def _given_back() -> float:
    labels = {"reason": "worker_lost"}
    return REGISTRY.get_sample_value("outbox_claims_given_back_total", labels) or 0.0


def _history(conn: psycopg.Connection[Any], schema: str, ids: list[int]) -> list[tuple]:
    return conn.execute(
        f'SELECT action_id, attempt, result, reason FROM "{schema}".agent_action_attempt'
        " WHERE action_id = ANY(%s) ORDER BY action_id, attempt",
        (ids,),
    ).fetchall()


def test_attempts_of_a_worker_killed_before_their_fence_run_again_within_seconds_not_a_lease(
    rig: DispatchRig, schema: str
) -> None:
    rig.claimer()
    doomed = rig.worker(threads=4)
    hang = {"hang_before_fence_attempt": 1}
    ids = rig.enqueue(rig.rb, lanes=3, per_lane=1, payload=hang)
    ids += rig.enqueue(rig.amo, lanes=3, per_lane=1, payload=hang)
    rig.wait_rows("dispatch_call", len(ids))  # every attempt taken, none past its fence
    doomed.kill()
    killed = time.monotonic()

    rig.worker(threads=4)
    rows = rig.wait_ended(ids, timeout=25)  # the lease is 60 s
    print(f"\n{len(ids)} lost attempts ended {time.monotonic() - killed:.1f}s after the kill")
    assert {r["state"] for r in rows} == {"DONE"}
    # The lost attempt counted; the second one ran, under the claim after the give-back.
    assert {r["attempt"] for r in rows} == {2}
    assert sorted(e["action_id"] for e in rig.effects()) == sorted(ids), "one effect each"
    with rig.connect() as conn:
        history = [tuple(h.values()) for h in _history(conn, schema, ids)]
    assert history == [
        row for i in sorted(ids) for row in ((i, 1, "RETRY", "WORKER_LOST"), (i, 2, "DONE", "DONE"))
    ]
    output = "\n".join(p.output() for p in rig.processes if p is not doomed)
    assert "has been silent for over 3s; gave back" in output, output
    assert f"gave back {len(ids)} of its attempts" in output, output


@pytest.fixture
def store_rig(database_url: str, schema: str) -> DispatchRig:
    return app_schema(database_url, schema)


def _heartbeat(conn: psycopg.Connection[Any], process_id: str, silent_for: float) -> None:
    heartbeat_row(conn, process_id, "worker", silent_for)


@pytest.mark.parametrize(
    ("silent", "said"), [(0.9, "0.9s"), (4.5, "4.5s"), (3, "3s"), (15, "15s"), (150, "2m 30s")]
)
def test_a_give_back_says_a_sub_second_silence_in_tenths_not_as_0s(
    silent: float, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="outbox.claimer"):
        report_given_back("worker_lost", "worker", [("w", "k")], timedelta(seconds=silent), "x")
    [record] = caplog.records
    assert f"worker w has been silent for over {said}; gave back 1 of its x" in record.message


def _service() -> LostWorkers:
    # Silent past 15 s, and for less than 15 + 5 + 60 s; judged by the claimer "me".
    return LostWorkers(timedelta(0), "me", heartbeat_interval=timedelta(seconds=5), lease=LEASE)


async def test_only_unfenced_attempts_of_workers_silent_past_three_beats_are_given_back(
    store_rig: DispatchRig, schema: str, caplog: pytest.LogCaptureFixture
) -> None:
    outbox, kind = store_rig.outbox(), store_rig.rb
    await asyncio.to_thread(store_rig.enqueue, kind, lanes=9, per_lane=1)
    url = outbox.settings.require_database_url()
    async with outbox.store() as store:
        claimed = [c.action.token for c in await store.claim({kind: 9}, LEASE, take=False)]

        async def take(taker: str, tokens: list) -> None:
            store.taker = taker
            assert all([await store.take_attempt(t) is not None for t in tokens])

        await take("lost", claimed[:4])
        await take("live", claimed[4:5])
        await take("stopped-cleanly", claimed[5:6])  # it finished, then took its row away
        await take("long-gone", claimed[6:7])
        await take("", claimed[7:8])  # names no worker
        store.taker = "lost"
        fenced = claimed[0]
        assert await store.begin_write(fenced, timedelta(0))  # its write may have started
        last = claimed[3]
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            _heartbeat(conn, "lost", 16)
            _heartbeat(conn, "live", 2)
            _heartbeat(conn, "long-gone", 200)  # its attempts are its lease's to end
            judge_row(conn)
            # The lost worker's attempt of an action with no attempt left: its lease ends it.
            conn.execute("UPDATE agent_action SET max_attempts = 1 WHERE id = %s", [last.action_id])
            names = dict(conn.execute("SELECT id, taken_by FROM agent_action").fetchall())
        assert [names[t.action_id] for t in claimed] == [
            *["lost"] * 4,
            "live",
            "stopped-cleanly",
            "long-gone",
            None,
            None,
        ]

        counted = _given_back()
        service = _service()
        with caplog.at_level(logging.WARNING, logger="outbox.claimer"):
            assert await service.run(store) == 2
        assert await service.run(store) == 0, "given back once"
        assert _given_back() == counted + 2
        [record] = [r for r in caplog.records if getattr(r, "event", "") == "worker_lost"]
        assert (record.worker, record.released) == ("lost", 2)  # type: ignore[attr-defined]

        given_back = claimed[1:3]
        with psycopg.connect(url, autocommit=True) as conn:
            rows = {
                row[0]: row[1:]
                for row in conn.execute(
                    f"SELECT id, state, epoch, attempt, lease_until, retry_reason"
                    f' FROM "{schema}".agent_action'
                )
            }
            history = _history(conn, schema, [t.action_id for t in given_back])
        for token in given_back:
            # Due again, same epoch, the taken attempt counted.
            assert rows[token.action_id] == ("ADMITTED", token.epoch, 1, None, "WORKER_LOST")
        assert history == [(t.action_id, 1, "RETRY", "WORKER_LOST") for t in given_back]
        kept = [claimed[0], *claimed[3:8]]
        assert {rows[t.action_id][0] for t in kept} == {"EXECUTING"}

        # The worker only stalled: it wakes up to find its fence and its finish refused.
        assert not await store.begin_write(given_back[0], timedelta(0))
        assert not await store.finish(given_back[0], Finish(ActionState.DONE, "DONE"))
        # Claimed again under a new epoch, which names no worker until a take does.
        again = await store.claim({kind: 9}, LEASE, take=False)
        assert {c.action.id: c.action.epoch for c in again} == {
            t.action_id: t.epoch + 1 for t in given_back
        }
        with psycopg.connect(url, autocommit=True) as conn:
            names = dict(conn.execute(f'SELECT id, taken_by FROM "{schema}".agent_action'))
            running = inspect(conn, fenced.action_id, schema=schema)
            reclaimed = inspect(conn, given_back[0].action_id, schema=schema)
        assert [names[t.action_id] for t in given_back] == [None, None]
        # `outbox inspect` names the worker whose take runs the latest claim.
        assert running is not None and reclaimed is not None
        assert running["taken_by"] == "lost"
        assert "taken by: lost" in render_inspect(running)
        assert reclaimed["taken_by"] is None
        assert "taken by" not in render_inspect(reclaimed)


@pytest.mark.parametrize(("judge_silent_for", "judge_beating_for", "given_back"), JUDGES)
async def test_only_a_claimer_beating_unbroken_for_the_silence_gives_back_attempts(
    store_rig: DispatchRig,
    schema: str,
    judge_silent_for: float,
    judge_beating_for: float,
    given_back: int,
) -> None:
    """A database outage silences every worker, the live ones too: a claimer judges a worker
    lost only while its own beats have run unbroken for as long as the worker's silence."""
    outbox, kind = store_rig.outbox(), store_rig.rb
    await asyncio.to_thread(store_rig.enqueue, kind, lanes=2, per_lane=1)
    url = outbox.settings.require_database_url()
    async with outbox.store() as store:
        store.taker = "quiet"
        tokens = [c.action.token for c in await store.claim({kind: 2}, LEASE, take=False)]
        assert all([await store.take_attempt(t) is not None for t in tokens])
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            _heartbeat(conn, "quiet", 16)
            heartbeat_row(conn, "me", "claimer", judge_silent_for, judge_beating_for)
        assert await _service().run(store) == given_back
        with psycopg.connect(url) as conn:
            states = [s for (s,) in conn.execute(f'SELECT state FROM "{schema}".agent_action')]
        assert states.count("EXECUTING") == 2 - given_back


async def test_a_hand_off_names_the_worker_that_takes_the_next_action(
    store_rig: DispatchRig, schema: str
) -> None:
    outbox, kind = store_rig.outbox(), store_rig.rb
    await asyncio.to_thread(store_rig.enqueue, kind, lanes=1, per_lane=2)
    async with outbox.store() as store:
        store.taker = "w-1"
        [first] = await store.claim({kind: 1}, LEASE, take=False)
        assert await store.take_attempt(first.action.token) is not None
        finished = await store.finish_and_hand_off(
            first.action.token, Finish(ActionState.DONE, "DONE"), None, fenced=False, lease=LEASE
        )
    assert finished is not None and finished.next is not None
    with psycopg.connect(store_rig.database_url) as conn:
        row = conn.execute(
            f'SELECT taken_by, taken_epoch = epoch FROM "{schema}".agent_action WHERE id = %s',
            [finished.next.action.id],
        ).fetchone()
    assert row == ("w-1", True)


async def test_a_claimers_housekeeping_gives_back_lost_attempts_other_housekeeping_does_not(
    store_rig: DispatchRig,
) -> None:
    outbox = store_rig.outbox()
    settings = outbox.settings
    async with outbox.store() as store:
        claimer = Maintenance.for_claimer(store, settings, claimer="me")
        assert "lost_workers" in claimer.turns
        assert "lost_workers" not in Maintenance.for_claimer(store, settings).turns
        [service] = [s for s in claimer.services if isinstance(s, LostWorkers)]
        assert service.silent == settings.heartbeat_interval * 3
        assert service.within == settings.heartbeat_interval * 4 + settings.lease


async def test_a_give_back_racing_the_fences_leaves_each_attempt_fenced_or_given_back(
    store_rig: DispatchRig, schema: str
) -> None:
    """A worker thought lost passes its fences while a claimer gives its attempts back: each
    ends up either fenced (its write goes ahead) or given back (its fence refused), never
    both, never neither."""
    outbox, kind = store_rig.outbox(), store_rig.rb
    await asyncio.to_thread(store_rig.enqueue, kind, lanes=60, per_lane=1)
    async with outbox.store() as store:
        store.taker = "lost"
        tokens = [c.action.token for c in await store.claim({kind: 60}, LEASE, take=False)]
        assert len(tokens) == 60
        assert all(await asyncio.gather(*(store.take_attempt(t) for t in tokens)))
        with psycopg.connect(store_rig.database_url, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            _heartbeat(conn, "lost", 16)
            judge_row(conn)
        # Half the fences go in before the give-back starts, the rest race it.
        early = await asyncio.gather(*(store.begin_write(t, timedelta(0)) for t in tokens[::2]))
        racing, given_back = await asyncio.gather(
            asyncio.gather(*(store.begin_write(t, timedelta(0)) for t in tokens[1::2])),
            _service().run(store),
        )
    assert all(early)
    fenced = {
        t.action_id
        for t, passed in zip([*tokens[::2], *tokens[1::2]], [*early, *racing], strict=True)
        if passed
    }
    with psycopg.connect(store_rig.database_url) as conn:
        rows = dict(
            conn.execute(
                f'SELECT id, state FROM "{schema}".agent_action WHERE id = ANY(%s)',
                ([t.action_id for t in tokens],),
            ).fetchall()
        )
    released = {i for i, state in rows.items() if state == "ADMITTED"}
    assert given_back == len(released)
    assert fenced.isdisjoint(released)
    assert fenced | released == {t.action_id for t in tokens}
    assert {rows[i] for i in fenced} == {"EXECUTING"}
