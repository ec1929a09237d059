"""The in-process claim (``Store.claim``): BEGIN, the fold, each kind's claim and the COMMIT go
to the server in one round trip, so a paused kind has to be left out by the claim statement
itself (the fold that reads the pauses answers only once everything was sent), and the
transaction holds its lane rows for the server's time only, whatever the client does
meanwhile."""

from __future__ import annotations

import asyncio
import tempfile
from datetime import timedelta

import psycopg
import pytest
from psycopg import pq
from psycopg_pool import AsyncConnectionPool

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox.operator.pausing import pause, resume

NOTE = ActionKind("NOTE")
OTHER = ActionKind("OTHER")
LEASE = timedelta(seconds=30)


@pytest.fixture
def ob(make_outbox):
    """An outbox of both kinds, migrated."""
    outbox = make_outbox()
    for kind in (NOTE, OTHER):
        outbox.declare(kind)
    outbox.migrate()
    return outbox


@pytest.fixture
def enqueue_in(database_url, schema):
    def enqueue_(kind: str, n: int, prefix: str, workspaces: int = 1) -> list[int]:
        with psycopg.connect(database_url) as conn:
            requests = [
                ActionRequest(
                    kind=kind,
                    workspace_id=f"w{i % workspaces}",
                    lane_key=f"{prefix}{i}",
                    idempotency_key=f"{prefix}{i}",
                )
                for i in range(n)
            ]
            actions = enqueue_many(conn, requests, schema=schema)
            conn.commit()
            return [a.id for a in actions]

    return enqueue_


async def test_a_paused_kind_claims_neither_heads_nor_reclaims_in_process_until_resumed(
    ob, database_url, schema, enqueue_in
):
    expiring = enqueue_in("NOTE", 3, "x")
    async with ob.store() as store:
        # Three claimed with a lease that runs out at once: reclaims waiting for NOTE.
        assert len(await store.claim({"NOTE": 3}, timedelta(milliseconds=1))) == 3
        waiting = enqueue_in("NOTE", 5, "n")
        others = enqueue_in("OTHER", 2, "o")
        await asyncio.sleep(0.01)
        with psycopg.connect(database_url) as conn:
            pause(conn, "NOTE", actor="test", schema=schema)
        claimed = await store.claim({"NOTE": 10, "OTHER": 10}, LEASE)
        # The other kind is claimed beside it, in the same round trip.
        assert sorted(c.action.id for c in claimed) == others
        with psycopg.connect(database_url) as conn:
            resume(conn, "NOTE", actor="test", schema=schema)
        claimed = await store.claim({"NOTE": 10, "OTHER": 10}, LEASE)
    assert sorted(c.action.id for c in claimed) == sorted(expiring + waiting)


def test_a_paused_kinds_claim_statement_claims_nothing_by_itself(
    ob, database_url, schema, enqueue_in, conn
):
    """The claimers and the in-process claim alike: the statement reads the pause."""
    from outbox._io import run_sync
    from outbox.store import claim_operation

    enqueue_in("NOTE", 4, "n")
    pause(conn, "NOTE", actor="test", schema=schema)
    conn.commit()
    # The fold run apart (intake=False after it), so the kind is not skipped by its answer.
    run_sync(conn, claim_operation(schema, {}, LEASE, take=True))
    claimed = run_sync(conn, claim_operation(schema, {"NOTE": 4}, LEASE, take=True, intake=False))
    conn.commit()
    assert claimed == []


async def test_a_claim_that_leaves_room_fills_it_with_a_second_round_trip(
    ob, database_url, schema, enqueue_in
):
    """Keys with fewer due heads than their share leave room; the second statement, in a
    transaction of its own after the first committed, fills it with other lanes."""
    # One key with many heads, three with one each: a share of 4 a key leaves 9 of 16.
    many = enqueue_in("NOTE", 12, "m")
    few = []
    with psycopg.connect(database_url) as conn:
        requests = [
            ActionRequest(
                kind="NOTE", workspace_id=f"v{i}", lane_key=f"f{i}", idempotency_key=f"f{i}"
            )
            for i in range(3)
        ]
        few = [a.id for a in enqueue_many(conn, requests, schema=schema)]
        conn.commit()
    async with ob.store() as store:
        claimed = await store.claim({"NOTE": 16}, LEASE)
    ids = [c.action.id for c in claimed]
    assert len(ids) == len(set(ids)) == 15
    assert set(ids) == set(many + few)


async def test_the_claim_is_one_round_trip_its_commit_included(
    ob, database_url, schema, enqueue_in
):
    """Everything the claim sends (BEGIN, the fold, each kind's claim, the COMMIT) goes before
    the server's first answer comes back (libpq's trace of the connection): the transaction is
    over in the server's time, not held open while a busy event loop gets round to sending the
    next statement."""
    enqueue_in("NOTE", 20, "n")
    enqueue_in("OTHER", 20, "o")
    pool = AsyncConnectionPool(
        database_url, min_size=1, max_size=1, kwargs={"autocommit": True}, open=False
    )
    await pool.open(wait=True)
    with tempfile.TemporaryFile(mode="w+") as trace:
        async with pool, ob.store(pool) as store:
            async with pool.connection() as conn:
                conn.pgconn.trace(trace.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            claimed = await store.claim({"NOTE": 20, "OTHER": 20}, LEASE)
            async with pool.connection() as conn:
                conn.pgconn.untrace()
        trace.seek(0)
        messages = [
            (fields[0], fields[2], " ".join(fields[3:]))
            for fields in (line.split("\t") for line in trace.read().splitlines())
            if fields[0] in ("F", "B") and len(fields) > 2
        ]
    assert len(claimed) == 40
    sent = [(name, text) for side, name, text in messages if side == "F"]
    assert [name for name, _ in sent].count("Sync") == 2, messages
    assert any('"BEGIN"' in text for _, text in sent), messages
    assert any('"COMMIT"' in text for _, text in sent), messages
    # After the server's first answer, nothing but a flush request is sent.
    first_answer = next(i for i, (side, _, _) in enumerate(messages) if side == "B")
    after = [name for side, name, _ in messages[first_answer:] if side == "F"]
    assert set(after) <= {"Flush"}, messages


def _counting_round_trips(monkeypatch, failing: int | None = None) -> list[int]:
    """Counts ``Store.claim``'s round trips (each a ``commit_pipelined``), by statements sent;
    the ``failing``-th (counting from 1) fails as a connection the server closed would."""
    from outbox import store as store_module

    real = store_module.commit_pipelined
    calls: list[int] = []

    async def counted(conn, statements, *, begin):
        calls.append(len(statements))
        if len(calls) == failing:
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return await real(conn, statements, begin=begin)

    monkeypatch.setattr(store_module, "commit_pipelined", counted)
    return calls


async def test_a_failed_second_round_trip_still_runs_what_the_first_claimed(
    ob, database_url, schema, enqueue_in, monkeypatch, caplog
):
    """The first round trip's claims are committed: if the one that fills the room fails (the
    server went away between the two), they are returned to run, not left to their leases."""
    enqueue_in("NOTE", 12, "m")
    with psycopg.connect(database_url) as conn:
        requests = [
            ActionRequest(
                kind="NOTE", workspace_id=f"v{i}", lane_key=f"f{i}", idempotency_key=f"f{i}"
            )
            for i in range(3)
        ]
        enqueue_many(conn, requests, schema=schema)
        conn.commit()
    calls = _counting_round_trips(monkeypatch, failing=2)
    async with ob.store() as store:
        claimed = await store.claim({"NOTE": 16}, LEASE)
    assert len(calls) == 2
    assert len(claimed) == 7  # a share of 4 of the busy key, one of each other key
    assert "second claim statement failed" in caplog.text
    with psycopg.connect(database_url) as conn:
        executing = conn.execute(
            f"SELECT count(*) FROM \"{schema}\".agent_action WHERE state = 'EXECUTING'"
        ).fetchone()[0]
    assert executing == 7


@pytest.mark.parametrize(
    ("heads", "key_cap", "claimed_n", "round_trips"),
    [
        ([1, 1, 1, 1], None, 4, 1),  # every key took less than its share: none has more due
        ([3, 3, 3, 3], 1, 4, 1),  # every key took what its cap of one left: none has room
        ([3, 3, 3, 3], 2, 8, 1),  # the same at a cap of two
        ([12, 1, 1, 1], None, 15, 2),  # w0 took its whole share of 4 and has more: a second pass
        ([12, 1, 1, 1], 6, 9, 2),  # ... up to its cap of 6
    ],
)
async def test_a_claim_asks_a_second_time_only_when_a_key_that_filled_its_share_may_have_more(
    ob, database_url, schema, monkeypatch, heads, key_cap, claimed_n, round_trips
):
    # Four keys (w0..w3) and a claim of 16: a share of 4 a key.
    with psycopg.connect(database_url) as conn:
        requests = [
            ActionRequest(kind="NOTE", workspace_id=f"w{w}", lane_key=f"w{w}-{i}",
                          idempotency_key=f"w{w}-{i}")
            for w, n in enumerate(heads)
            for i in range(n)
        ]  # fmt: skip
        enqueue_many(conn, requests, schema=schema)
        conn.commit()
    calls = _counting_round_trips(monkeypatch)
    caps = None if key_cap is None else {"NOTE": key_cap}
    async with ob.store() as store:
        claimed = await store.claim({"NOTE": 16}, LEASE, key_caps=caps)
    assert len(claimed) == claimed_n
    assert len(calls) == round_trips, calls
