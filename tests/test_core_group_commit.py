"""Group commit (outbox.batching): concurrent takes, fences and ends of one process share
statements, and each row still keeps its own epoch check, exactly as the single-row statements.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

import psycopg
from psycopg.rows import dict_row

from outbox import ActionKind, ActionRequest, ActionState, enqueue
from outbox.fence_token import FenceToken
from outbox.results import Finish

NOTE = ActionKind("NOTE")


def setup(make_outbox, database_url, schema, n):
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    with psycopg.connect(database_url) as conn:
        for i in range(n):
            enqueue(
                conn,
                ActionRequest(
                    kind="NOTE", workspace_id="w", lane_key=f"l{i}", idempotency_key=f"k{i}"
                ),
                schema=schema,
            )
        conn.commit()
    return ob


def rows(database_url, schema):
    with psycopg.connect(database_url, row_factory=dict_row) as conn:
        return {
            r["id"]: r for r in conn.execute(f'SELECT * FROM "{schema}".agent_action ORDER BY id')
        }


async def test_concurrent_fences_share_statements_and_a_stale_epoch_is_refused(
    make_outbox, database_url, schema
):
    ob = setup(make_outbox, database_url, schema, 40)
    async with ob.store() as store:
        claimed = await store.claim({"NOTE": 40}, ob.settings.lease)
        assert len(claimed) == 40
        # Every other caller names the epoch before its claim: a stale attempt.
        calls = [
            store.begin_write(FenceToken(c.action.id, c.action.epoch - (i % 2)), timedelta(0))
            for i, c in enumerate(claimed)
        ]
        results = await asyncio.gather(*calls)
        fence = store.group_writers[1]
        assert fence.statements < fence.calls == 40
    assert results == [i % 2 == 0 for i in range(40)]
    after = rows(database_url, schema)
    for i, c in enumerate(claimed):
        assert (after[c.action.id]["write_started_at"] is not None) == (i % 2 == 0)


async def test_a_fence_with_less_than_its_margin_left_is_refused_inside_a_batch(
    make_outbox, database_url, schema
):
    ob = setup(make_outbox, database_url, schema, 10)
    async with ob.store() as store:
        claimed = await store.claim({"NOTE": 10}, timedelta(minutes=5))
        margins = [timedelta(0) if i < 5 else timedelta(minutes=10) for i in range(10)]
        results = await asyncio.gather(
            *(store.begin_write(c.action.token, m) for c, m in zip(claimed, margins, strict=True))
        )
    assert results == [True] * 5 + [False] * 5


async def test_a_twin_delivery_in_one_batch_is_taken_once(make_outbox, database_url, schema):
    ob = setup(make_outbox, database_url, schema, 20)
    async with ob.store() as store:
        claimed = await store.claim({"NOTE": 20}, ob.settings.lease, take=False)
        keys = [c.action.token for c in claimed]
        # Each message delivered twice, all at once: one take per (id, epoch).
        taken = await asyncio.gather(*(store.take_attempt(token) for token in keys + keys))
        take = store.group_writers[0]
        assert take.statements < take.calls
    got = [t.action.id for t in taken if t is not None]
    assert sorted(got) == sorted(token.action_id for token in keys)


async def test_concurrent_ends_record_only_their_own_epoch(make_outbox, database_url, schema):
    ob = setup(make_outbox, database_url, schema, 30)
    async with ob.store() as store:
        claimed = await store.claim({"NOTE": 30}, ob.settings.lease)
        recorded = await asyncio.gather(
            *(
                store.finish(
                    FenceToken(c.action.id, c.action.epoch + (1 if i % 3 == 0 else 0)),
                    Finish(ActionState.DONE, "DONE", ref=f"ref-{c.action.id}"),
                )
                for i, c in enumerate(claimed)
            )
        )
    assert recorded == [i % 3 != 0 for i in range(30)]
    after = rows(database_url, schema)
    for i, c in enumerate(claimed):
        row = after[c.action.id]
        if i % 3:
            assert (row["state"], row["readback_ref"]) == ("DONE", f"ref-{c.action.id}")
        else:
            assert (row["state"], row["readback_ref"]) == ("EXECUTING", None)


async def test_a_batch_that_deadlocks_is_rerun_one_caller_at_a_time():
    # A real deadlock needs an application transaction holding lane rows in another order;
    # here the batched statement raises what PostgreSQL would, and the fallback is observed.
    from outbox.batching import GroupWriter

    singles: list[int] = []

    async def many(params):
        await asyncio.sleep(0)
        raise psycopg.errors.DeadlockDetected("deadlock detected")

    async def one(p):
        singles.append(p)
        return p * 10

    writer = GroupWriter("test", many, one, key=lambda p: p)
    results = await asyncio.gather(*(writer(i) for i in range(5)))
    assert results == [0, 10, 20, 30, 40]
    assert sorted(singles) == [0, 1, 2, 3, 4]


async def test_a_batch_one_callers_row_fails_fails_only_that_caller():
    # One caller's parameters the statement refuses (an id out of bigint range): the batch
    # fails as a whole, and only that caller gets the error after the one-at-a-time re-run.
    from outbox.batching import GroupWriter

    bad = 2**70

    async def many(params):
        await asyncio.sleep(0)
        if bad in params:
            raise psycopg.errors.NumericValueOutOfRange("bigint out of range")
        return {p: p * 10 for p in params}

    async def one(p):
        await asyncio.sleep(0)
        if p == bad:
            raise psycopg.errors.NumericValueOutOfRange("bigint out of range")
        return p * 10

    writer = GroupWriter("test", many, one, key=lambda p: p)
    results = await asyncio.gather(*(writer(p) for p in [1, 2, bad, 3, 4]), return_exceptions=True)
    assert results[:2] == [10, 20] and results[3:] == [30, 40]
    assert isinstance(results[2], psycopg.errors.NumericValueOutOfRange)
    assert writer.statements < 5, "the callers never shared a statement"


async def test_callers_that_arrive_while_a_statement_runs_share_the_next_one():
    """One statement of a sort at a time: every caller that arrives while it runs waits for it
    and then goes in a single next statement, never in a second one started alongside (which
    split the callers into smaller batches, each paying a statement's fixed cost)."""
    from outbox.batching import GroupWriter

    running = asyncio.Event()
    release = asyncio.Event()
    batches: list[list[int]] = []

    async def many(params):
        batches.append(list(params))
        running.set()
        await release.wait()
        return {p: p for p in params}

    async def one(p):
        return (await many([p]))[p]

    writer = GroupWriter("test", many, one, key=lambda p: p)
    first = asyncio.ensure_future(writer(0))
    await running.wait()
    later = [asyncio.ensure_future(writer(i)) for i in range(1, 6)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert batches == [[0]], "a second statement started while the first ran"
    release.set()
    assert await asyncio.gather(first, *later) == [0, 1, 2, 3, 4, 5]
    assert batches == [[0], [1, 2, 3, 4, 5]]
    assert writer.statements == 2
