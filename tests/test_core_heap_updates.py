"""An attempt writes its action's row three times in process (the claim, the fence, the finish)
and four times through a fabric (a worker's take too). The fence changes no column an index
holds, so its version can stay on the old one's page as a heap-only (HOT) update, which adds no
index entry; the table keeps room on its pages for that (migration 0019). Counted with the
server's statistics of the test's own transaction, never a timing."""

from __future__ import annotations

from datetime import timedelta

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import run_sync
from outbox.batching import MAX_BATCH
from outbox.queries import queries_for
from outbox.store import ClaimedAction, claim_operation

NOTE = ActionKind("NOTE")
LEASE = timedelta(minutes=5)
#: Enough actions to fill many pages, enqueued as an application's batches would be.
ACTIONS = 1_200
ENQUEUE_BATCH = 200


def _enqueued_and_claimed(make_outbox, database_url: str, schema: str, take: bool):
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        for start in range(0, ACTIONS, ENQUEUE_BATCH):
            requests = [
                ActionRequest(
                    kind="NOTE", workspace_id="w", lane_key=f"l{i}", idempotency_key=f"k{i}"
                )
                for i in range(start, start + ENQUEUE_BATCH)
            ]
            enqueue_many(conn, requests, schema=schema)
        claimed: list[ClaimedAction] = []
        while len(claimed) < ACTIONS:
            took = run_sync(conn, claim_operation(schema, {"NOTE": MAX_BATCH}, LEASE, take=take))
            assert took, f"claimed {len(claimed)} of {ACTIONS}"
            claimed += took
    return claimed


def _batches(claimed: list[ClaimedAction]) -> list[list[ClaimedAction]]:
    return [claimed[i : i + MAX_BATCH] for i in range(0, len(claimed), MAX_BATCH)]


def _updates(conn: psycopg.Connection, schema: str) -> tuple[int, int]:
    """Rows of agent_action this transaction updated, and how many of them were HOT."""
    row = conn.execute(
        "SELECT pg_stat_get_xact_tuples_updated(%(t)s::regclass),"
        " pg_stat_get_xact_tuples_hot_updated(%(t)s::regclass)",
        {"t": f'"{schema}".agent_action'},
    ).fetchone()
    assert row is not None
    return row[0], row[1]


@pytest.mark.parametrize("path", ["in_process", "through_a_fabric"])
def test_most_fences_add_no_index_entries(make_outbox, database_url, schema, path):
    """Actions enqueued in bulk, claimed (and, through a fabric, taken by a worker): most
    fences are heap-only updates (64-78% here; at the default fillfactor of 100, 5-13%)."""
    claimed = _enqueued_and_claimed(make_outbox, database_url, schema, take=path == "in_process")
    q = queries_for(schema)
    tokens = [(c.action.id, c.action.epoch) for c in claimed]
    if path == "through_a_fabric":
        with psycopg.connect(database_url, autocommit=True) as conn:
            for batch in _batches(claimed):
                params = {
                    "ids": [c.action.id for c in batch],
                    "epochs": [c.action.epoch for c in batch],
                    "lease": LEASE,
                    "taker": "",
                }
                taken = conn.execute(q["take_attempts"], params).fetchall()
                assert len(taken) == len(batch)
    with psycopg.connect(database_url) as conn:  # one transaction: its own statistics
        for batch in _batches(claimed):
            params = {
                "ids": [c.action.id for c in batch],
                "epochs": [c.action.epoch for c in batch],
                "margins": [timedelta(0)] * len(batch),
                "refs": [None] * len(batch),
                "claimed_ats": [None] * len(batch),
            }
            fenced = conn.execute(q["begin_writes"], params).fetchall()
            assert len(fenced) == len(batch)
        updated, hot = _updates(conn, schema)
    assert updated == len(tokens)
    assert hot >= 0.5 * updated, f"{hot} of {updated} fences were heap-only updates"
