"""A worker's take commits without waiting for its WAL flush, and the fence waits for its.

The take only marks the claim consumed (and counts the attempt): a take that a server crash
loses was followed by no fence, since the fence is the next statement on the same server and
its synchronous commit flushes the take's WAL first. So the take may skip the flush, as a claim
round does, and a fence or a finish may not: a lost fence could let an at-most-once write run
twice, a lost finish would turn a DONE into a reclaim. Each statement is run inside an open
transaction here, so the setting it leaves for its commit can be read before that commit.
"""

from __future__ import annotations

from datetime import timedelta

import psycopg

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import run_sync
from outbox.queries import queries_for
from outbox.store import claim_operation, intake_operation

NOTE = ActionKind("NOTE")
LEASE = timedelta(minutes=5)


def _enqueued(make_outbox, conn: psycopg.Connection, schema: str, n: int) -> None:
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    requests = [
        ActionRequest(NOTE, lane_key=f"l{i}", idempotency_key=f"k{i}", workspace_id="w")
        for i in range(n)
    ]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()


def _claimed(make_outbox, conn: psycopg.Connection, schema: str, n: int) -> list[tuple[int, int]]:
    _enqueued(make_outbox, conn, schema, n)
    claimed = run_sync(conn, claim_operation(schema, {NOTE.name: n}, LEASE, take=False))
    conn.commit()
    return [(c.action.id, c.action.epoch) for c in claimed]


def _commit_setting(conn: psycopg.Connection, sql: str, params: dict) -> tuple[int, str]:
    """Rows ``sql`` returned and the synchronous_commit its transaction would commit with."""
    with conn.transaction(force_rollback=True):
        rows = conn.execute(sql, params).fetchall()
        (setting,) = conn.execute("SHOW synchronous_commit").fetchone()
    return len(rows), setting


def test_a_take_commits_without_waiting_for_its_flush(make_outbox, conn, schema) -> None:
    (one, *many) = _claimed(make_outbox, conn, schema, 4)
    q = queries_for(schema)
    taken, setting = _commit_setting(
        conn, q["take_attempt"], {"id": one[0], "epoch": one[1], "lease": LEASE, "taker": ""}
    )
    assert (taken, setting) == (1, "off")
    batch = {
        "ids": [i for i, _ in many],
        "epochs": [e for _, e in many],
        "lease": LEASE,
        "taker": "",
    }
    taken, setting = _commit_setting(conn, q["take_attempts"], batch)
    assert (taken, setting) == (3, "off")


def test_a_fence_waits_for_its_flush(make_outbox, conn, schema) -> None:
    ((action_id, epoch),) = _claimed(make_outbox, conn, schema, 1)
    q = queries_for(schema)
    fence = {
        "id": action_id,
        "epoch": epoch,
        "margin": timedelta(seconds=1),
        "ref": None,
        "claimed_at": None,
    }
    fenced, setting = _commit_setting(conn, q["begin_write"], fence)
    assert (fenced, setting) == (1, "on")


def test_an_in_process_claim_and_its_fold_commit_without_waiting_for_their_flush(
    make_outbox, conn, schema
) -> None:
    """An in-process claim is its own take: the fence that follows flushes it, as it flushes a
    worker's take. The fold before it (lanes from the intake into the lane rows) is redone by
    the next claim if a crash loses it."""
    _enqueued(make_outbox, conn, schema, 3)
    q = queries_for(schema)
    folded, setting = _commit_setting(conn, q["lane_intake"], {"limit": 10})
    assert (folded, setting) == (1, "off")
    assert run_sync(conn, intake_operation(schema)).folded == 3
    conn.commit()
    with conn.transaction(force_rollback=True):
        claim = claim_operation(schema, {NOTE.name: 3}, LEASE, take=True, intake=False)
        claimed = run_sync(conn, claim)
        (setting,) = conn.execute("SHOW synchronous_commit").fetchone()
    assert (len(claimed), setting) == (3, "off")
