"""A new connection of the executing side's pool runs an attempt's statements once, changing
nothing, before it serves; a warm-up that fails never keeps the connection from serving."""

from __future__ import annotations

from datetime import timedelta

import psycopg

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import run_sync
from outbox.store import claim_operation
from outbox.warmup import _statements

NOTE = ActionKind("NOTE")


def _rows(conn: psycopg.Connection, schema: str) -> tuple[list[tuple], int]:
    actions = conn.execute(
        f"SELECT id, state, epoch, attempt, taken_epoch, lease_until, write_started_at"
        f' FROM "{schema}".agent_action ORDER BY id'
    ).fetchall()
    (attempts,) = conn.execute(f'SELECT count(*) FROM "{schema}".agent_action_attempt').fetchone()
    return actions, attempts


async def test_a_new_connection_has_prepared_an_attempt_s_statements_and_changed_nothing(
    make_outbox, database_url, schema
) -> None:
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        requests = [
            ActionRequest(NOTE, lane_key=f"l{i}", idempotency_key=f"k{i}", workspace_id="w")
            for i in range(6)
        ]
        enqueue_many(conn, requests, schema=schema)
        # Some waiting, some claimed and not taken: rows a careless warm-up could touch.
        run_sync(conn, claim_operation(schema, {NOTE.name: 3}, timedelta(minutes=5), take=False))
        before = _rows(conn, schema)
        async with ob.store() as store, store.connection() as warm:
            prepared = await (
                await warm.execute("SELECT statement FROM pg_prepared_statements")
            ).fetchall()
        assert _rows(conn, schema) == before
    texts = " ".join(row[0] for row in prepared)
    assert len(prepared) >= len(_statements(schema, timedelta(minutes=5))), texts
    for opening in ("WITH finished AS", "WITH fenced AS", "WITH target AS MATERIALIZED"):
        assert opening in texts, texts


async def test_a_connection_whose_warm_up_fails_still_serves(make_outbox) -> None:
    """On a schema not migrated yet every warm-up statement fails; the pool still opens, and
    its connections answer."""
    ob = make_outbox()
    async with ob.store() as store, store.connection() as conn:
        assert await (await conn.execute("SELECT 1")).fetchone() == (1,)
        assert conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
