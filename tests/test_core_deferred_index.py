"""An action due at its enqueue enters no index by its due time: ix_agent_action_deferred holds
only the admitted actions whose due time was moved past their creation (a not_before, a retry's
back-off, a give-back). The operator's reads that counted the admitted actions by kind and due
time (the backlog's due count, the limits view's waits) still count every way an action waits,
and the waits read that index alone, not the waiting actions."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from outbox import ActionKind, ActionRequest, Done, Retry, enqueue, enqueue_many
from outbox._io import run_sync
from outbox.backlog import backlog_operation
from outbox.fence_token import FenceToken
from outbox.limits_view import limits_view_operation
from outbox.queries import queries_for
from outbox.store import claim_operation, release_claims_operation
from tests.support import ScriptedAdapter

WAITS = ActionKind("WAITS")
LEASE = timedelta(minutes=5)


def _request(key: str, **fields: Any) -> ActionRequest:
    return ActionRequest(
        WAITS, workspace_id="w", lane_key=f"lane-{key}", idempotency_key=key, **fields
    )


def _index_bytes(conn: psycopg.Connection[Any], schema: str) -> int:
    (size,) = conn.execute(
        "SELECT pg_relation_size(format('%%I.ix_agent_action_deferred', %s::text)::regclass)",
        [schema],
    ).fetchone() or (0,)
    return int(size)


def test_an_action_due_at_its_enqueue_writes_no_entry_where_deferred_ones_do(
    make_outbox, database_url, schema
):
    ob = make_outbox()
    ob.declare(WAITS)
    ob.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        empty = _index_bytes(conn, schema)
        # Due now, by both enqueues, and with a not_before that has already passed.
        enqueue_many(conn, [_request(f"now-{i}") for i in range(2_000)], schema=schema)
        past = datetime.now(UTC) - timedelta(hours=1)
        enqueue_many(
            conn, [_request(f"past-{i}", not_before=past) for i in range(500)], schema=schema
        )
        for i in range(50):
            enqueue(conn, _request(f"one-{i}"), schema=schema)
        assert _index_bytes(conn, schema) == empty
        later = datetime.now(UTC) + timedelta(hours=1)
        enqueue_many(
            conn, [_request(f"later-{i}", not_before=later) for i in range(2_000)], schema=schema
        )
        assert _index_bytes(conn, schema) > empty + 8192


def test_the_backlog_and_the_waits_count_every_way_an_action_waits(
    make_outbox, database_url, schema
):
    def script(attempt):
        return Retry(after=timedelta(hours=2)) if attempt.lane_key == "lane-retried" else Done()

    ob = make_outbox()
    ob.register(WAITS, ScriptedAdapter(script))
    ob.migrate()
    later = datetime.now(UTC) + timedelta(hours=1)
    with psycopg.connect(database_url, autocommit=True) as conn:
        enqueue(conn, _request("retried"), schema=schema)

        async def run_once():
            async with ob.store() as store:
                return await ob.claim_and_run(ob.executor(store))

        assert len(asyncio.run(run_once())) == 1  # backs off for two hours
        for key in ("fresh-1", "fresh-2", "given-back"):
            enqueue(conn, _request(key), schema=schema)
        enqueue(conn, _request("scheduled", not_before=later), schema=schema)
        enqueue(
            conn,
            _request("expired", expires_at=datetime.now(UTC) + timedelta(seconds=1)),
            schema=schema,
        )
        claimed = run_sync(conn, claim_operation(schema, {WAITS.name: 1}, LEASE, take=False))
        assert [c.action.idempotency_key for c in claimed] == ["fresh-1"]
        # A claim no worker took, given back: due again at once (and "fresh-1" stays in flight).
        conn.execute(
            f'UPDATE "{schema}".agent_action SET lease_until = now() WHERE idempotency_key = %s',
            ["fresh-1"],
        )
        (token,) = [FenceToken(c.action.id, c.action.epoch) for c in claimed]
        assert run_sync(conn, release_claims_operation(schema, [token])) == [token]
        conn.execute(
            f"UPDATE \"{schema}\".agent_action SET expires_at = now() - interval '1 second'"
            " WHERE idempotency_key = 'expired'"
        )
        backlog = run_sync(conn, backlog_operation(schema)).kinds[WAITS.name]
        view = run_sync(conn, limits_view_operation(schema, {})).kinds[WAITS.name]
    # Due: "fresh-1" (given back), "fresh-2" and "given-back"; not the expired one, nor the
    # scheduled and the retried one, which wait.
    assert backlog.due == 3
    assert 0 <= backlog.oldest_due_age < 60
    assert view.waiting == 2
    assert view.next_due_at is not None
    assert abs((view.next_due_at - later).total_seconds()) < 1


def test_the_waits_read_the_deferred_actions_only(make_outbox, database_url, schema):
    ob = make_outbox()
    ob.declare(WAITS)
    ob.migrate()
    later = datetime.now(UTC) + timedelta(hours=1)
    with psycopg.connect(database_url, autocommit=True) as conn:
        enqueue_many(conn, [_request(f"now-{i}") for i in range(3_000)], schema=schema)
        enqueue_many(
            conn, [_request(f"later-{i}", not_before=later) for i in range(3)], schema=schema
        )
        conn.execute(f'VACUUM ANALYZE "{schema}".agent_action')
        sql = queries_for(schema)["waits_by_kind"]
        (raw,) = conn.execute(f"EXPLAIN (ANALYZE, FORMAT JSON) {sql}").fetchone() or ([],)
    plan = raw[0]["Plan"]
    assert _reads(plan) == {"ix_agent_action_deferred"}
    assert plan["Actual Rows"] == 1


def _reads(node: dict[str, Any]) -> set[str]:
    """The indexes a plan read agent_action through (a sequential scan reads as "scan")."""
    own = set()
    if node["Node Type"] in ("Index Scan", "Index Only Scan", "Bitmap Index Scan"):
        own = {node["Index Name"]}
    elif node["Node Type"] == "Seq Scan" and node["Relation Name"] == "agent_action":
        own = {"scan"}
    return own | {name for child in node.get("Plans", []) for name in _reads(child)}


def test_the_blocked_lanes_gauge_reads_the_attempted_actions_not_every_lane(
    make_outbox, database_url, schema
):
    """A backlog of fresh lanes, folded into lane rows and never attempted, costs the backlog
    gauges' blocked-lanes count a page or two, not every lane row and its head's row (it once
    read them all: 50 pages for these 2,000 lanes at every refresh, and in a drain of 200,000
    four probes of agent_action an action more)."""
    ob = make_outbox()
    ob.declare(WAITS)
    ob.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        enqueue_many(conn, [_request(f"fresh-{i}") for i in range(2_000)], schema=schema)
        conn.execute(f'SELECT "{schema}".agent_action_lane_intake(5000)')
        (lanes,) = conn.execute(
            f'SELECT count(*) FROM "{schema}".agent_action_lane'
        ).fetchone() or (0,)
        conn.execute(f'VACUUM ANALYZE "{schema}".agent_action')
        conn.execute(f'VACUUM ANALYZE "{schema}".agent_action_lane')
        sql = queries_for(schema)["blocked_lanes_by_kind"]
        (raw,) = conn.execute(f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}").fetchone() or ([],)
    assert lanes == 2_000
    plan = raw[0]["Plan"]
    assert plan["Actual Rows"] == 0
    assert plan["Shared Hit Blocks"] + plan["Shared Read Blocks"] < 10, plan
