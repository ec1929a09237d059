"""A claim costs what the due lane heads cost, not what the backlog behind them costs.

Compared by the buffers the claim statement touches (EXPLAIN ANALYZE BUFFERS), not wall time.
"""

from __future__ import annotations

import json
from datetime import timedelta

import psycopg
import pytest

from outbox import ActionKind
from outbox.queries import queries_for
from outbox.store import claim_heads_statement

NOTE = ActionKind("NOTE")


def fill(
    conn, schema: str, *, hot_lane: int, single_lanes: int, ended: int = 0, analyze: bool = True
) -> None:
    """``hot_lane`` actions in one lane, due first, then ``single_lanes`` one-action lanes;
    vacuumed and analyzed unless ``analyze`` is False."""
    conn.execute(f'SET search_path TO "{schema}"')
    if ended:
        # History: ended rows written as they are at rest (the guard refuses inserting an ended
        # row, so triggers are off for this bulk load, which needs a superuser).
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "INSERT INTO agent_action (kind, state, workspace_id, lane_key, idempotency_key,"
            " stop_reason, available_at, ended_at, attempt, epoch)"
            " SELECT 'NOTE', 'DONE', 'w', 'old-' || g, 'old-' || g, 'DONE',"
            " now() - interval '2 days', now() - interval '1 day', 1, 1"
            " FROM generate_series(1, %s) g",
            (ended,),
        )
        conn.execute("SET session_replication_role = DEFAULT")
    if hot_lane:
        conn.execute(
            "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
            " available_at) SELECT 'NOTE', 'w', 'hot', 'hot-' || g, '{}',"
            " now() - interval '1 day' + g * interval '1 ms' FROM generate_series(1, %s) g",
            (hot_lane,),
        )
    conn.execute(
        "INSERT INTO agent_action (kind, workspace_id, lane_key, idempotency_key, payload,"
        " available_at) SELECT 'NOTE', 'w', 'single-' || g, 'single-' || g, '{}',"
        " now() - interval '1 hour' FROM generate_series(1, %s) g",
        (single_lanes,),
    )
    conn.execute("SELECT agent_action_lane_intake(10000000)")  # as the next claim would
    conn.commit()
    if not analyze:
        return
    # Steady state: autovacuum has cleaned up behind the bulk load, as it would in production.
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE agent_action")
    conn.execute("VACUUM ANALYZE agent_action_lane")
    conn.autocommit = False


def _rows_visited(node: dict) -> int:
    own = node["Actual Rows"] * node["Actual Loops"]
    return own + sum(_rows_visited(child) for child in node.get("Plans", []))


def claim_buffers(conn, schema: str, limit: int = 100) -> tuple[int, int, int]:
    """(buffers touched, rows visited by the plan, rows claimed) of one claim batch, rolled
    back."""
    top = claim_plan(conn, schema, limit)
    buffers = top["Shared Hit Blocks"] + top["Shared Read Blocks"]
    return buffers, _rows_visited(top), top["Actual Rows"]


def claim_plan(conn, schema: str, limit: int = 100) -> dict:
    """The executed plan (EXPLAIN ANALYZE) of one claim batch, rolled back."""
    sql = queries_for(schema)["claim_heads"]
    with conn.transaction(force_rollback=True):
        (plan,) = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql,
            {
                "kind": "NOTE",
                "limit": limit,
                "lease": timedelta(minutes=5),
                "take": False,
                "claimer": None,
                # Every action here is of workspace 'w': one limit key, its whole share.
                "reclaim": True,
                "heads": True,
                "keys": ["w"],
                "after": "",
                "walk": 1,
                "steps": 1,
                "per_key": limit,
                "key_cap": None,
            },
        ).fetchone()
    return (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]


def _nodes(node: dict, node_type: str) -> list[dict]:
    own = [node] if node["Node Type"] == node_type else []
    return own + [n for child in node.get("Plans", []) for n in _nodes(child, node_type)]


def claim_buffers_of_two(
    conn, schema: str, first: dict[str, int], second: dict[str, int]
) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """``claim_buffers`` of a claim over ``fill(**first)``, then of one over ``fill(**second)``
    alone (the tables emptied in between)."""
    fill(conn, schema, **first)
    before = claim_buffers(conn, schema)
    conn.execute(
        f'TRUNCATE "{schema}".agent_action, "{schema}".agent_action_lane,'
        f' "{schema}".agent_action_lane_intake'
    )
    conn.commit()
    fill(conn, schema, **second)
    return before, claim_buffers(conn, schema)


def outbox_on(make_outbox):
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    return ob


@pytest.mark.slow
def test_a_hot_lane_costs_a_claim_no_more_than_a_small_table(make_outbox, database_url, schema):
    outbox_on(make_outbox)
    with psycopg.connect(database_url) as conn:
        (small, small_visited, small_rows), (hot, hot_visited, hot_rows) = claim_buffers_of_two(
            conn,
            schema,
            {"hot_lane": 0, "single_lanes": 1_000},
            {"hot_lane": 100_000, "single_lanes": 1_000},
        )
    assert small_rows == hot_rows == 100
    assert hot_visited <= 1.5 * small_visited, (hot_visited, small_visited)
    assert hot <= 1.5 * small, (hot, small)


@pytest.mark.slow
def test_history_costs_a_claim_nothing(make_outbox, database_url, schema):
    outbox_on(make_outbox)
    with psycopg.connect(database_url) as conn:
        (small, small_visited, _), (with_history, visited, rows_claimed) = claim_buffers_of_two(
            conn,
            schema,
            {"hot_lane": 0, "single_lanes": 1_000},
            {"hot_lane": 0, "single_lanes": 1_000, "ended": 200_000},
        )
    assert rows_claimed == 100
    # The rows visited are the same; the buffers grow only with the B-tree depth of the
    # primary-key and idempotency indexes (one level more at 200,000 rows).
    assert visited <= 1.5 * small_visited, (visited, small_visited)
    assert with_history <= 1.5 * small, (with_history, small)


@pytest.mark.slow
def test_many_due_heads_cost_a_claim_no_more_than_a_few(make_outbox, database_url, schema):
    """A claim of 100 reaches each candidate's action by a probe of its own, however many
    actions are due: a join there was planned as a hash join over a scan of every admitted
    action wherever that scan looked cheaper than the probes (a table of a few thousand)."""
    outbox_on(make_outbox)
    with psycopg.connect(database_url) as conn:
        (few, few_visited, few_rows), (many, many_visited, many_rows) = claim_buffers_of_two(
            conn,
            schema,
            {"hot_lane": 0, "single_lanes": 1_000},
            {"hot_lane": 0, "single_lanes": 3_000},
        )
    assert few_rows == many_rows == 100
    assert many_visited <= 1.1 * few_visited, (many_visited, few_visited)
    assert many <= 1.1 * few, (many, few)


def test_a_small_claim_reads_few_heads_of_many_that_tie(make_outbox, database_url, schema):
    """One batch enqueue gives every lane's head the same due time: a claim of one head reads a
    few of them, not every head that ties on (priority, due time)."""
    outbox_on(make_outbox)
    with psycopg.connect(database_url) as conn:
        fill(conn, schema, hot_lane=0, single_lanes=1_000)
        _, visited, rows_claimed = claim_buffers(conn, schema, limit=1)
    assert rows_claimed == 1
    assert visited < 100, visited


def test_a_claim_probes_each_head_while_the_statistics_say_the_table_is_empty(
    make_outbox, database_url, schema
):
    """A new outbox's first burst: the tables were analyzed empty, autovacuum has not come round
    since. A claim must still reach each head's action, and look behind it in its lane, by a
    probe of its own: planned for the empty table, a scan of the due actions, or of every
    waiting one, a head compared every pair (28,800 rows for 96 heads)."""
    outbox_on(make_outbox)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for table in ("agent_action", "agent_action_lane"):
            conn.execute(f'ANALYZE "{schema}".{table}')
    with psycopg.connect(database_url) as conn:
        fill(conn, schema, hot_lane=300, single_lanes=600, analyze=False)
        _, visited, rows_claimed = claim_buffers(conn, schema)
        conn.autocommit = True
        for table in ("agent_action", "agent_action_lane"):
            conn.execute(f'VACUUM ANALYZE "{schema}".{table}')
        conn.autocommit = False
        _, visited_analyzed, _ = claim_buffers(conn, schema)
    assert rows_claimed == 100
    assert visited <= 1.5 * visited_analyzed, (visited, visited_analyzed)


def test_a_claim_updates_each_head_through_the_tuple_its_lock_found(
    make_outbox, database_url, schema
):
    """The claim locks each head by a primary-key probe and updates the row version it locked
    by its tuple id: no second probe of the primary key a head."""
    outbox_on(make_outbox)
    with psycopg.connect(database_url) as conn:
        fill(conn, schema, hot_lane=0, single_lanes=150)
        top = claim_plan(conn, schema)
    assert top["Actual Rows"] == 100
    updates = [n for n in _nodes(top, "ModifyTable") if n.get("Relation Name") == "agent_action"]
    assert len(updates) == 2, "the reclaims' update and the heads'"
    tid_scans = [n for u in updates for n in _nodes(u, "Tid Scan")]
    assert sum(n["Actual Loops"] for n in tid_scans) == 100, json.dumps(updates, indent=1)
    assert not [n for u in updates for n in _nodes(u, "Index Scan") if n["Actual Loops"] > 0]


def test_a_claim_reads_a_keys_dead_lane_entries_once_while_the_horizon_is_held(
    make_outbox, database_url, schema
):
    """While another session holds a snapshot, no scan can mark the lane index's dead entries
    dead, and each scan that reaches a key steps over them all. A kind with one limit key: its
    walk reaches the key once (its probes after the wrap stop short of the first key), and the
    heads' scan starts at the first entry the walk found: the dead are read once. Counted as the
    index entries the claim's scans read."""
    outbox_on(make_outbox)
    dead = 2_000
    with (
        psycopg.connect(database_url) as conn,
        psycopg.connect(database_url) as holder,
    ):
        fill(conn, schema, hot_lane=0, single_lanes=dead)
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")  # its snapshot now holds the horizon
        # Every lane busy: each row's entry in the ready index points at a dead version now.
        conn.execute(f'UPDATE "{schema}".agent_action_lane SET executing_id = head_id')
        conn.execute(
            f'INSERT INTO "{schema}".agent_action (kind, workspace_id, lane_key,'
            " idempotency_key, payload) VALUES ('NOTE', 'w', 'late', 'late', '{}')"
        )
        conn.execute(f'SELECT "{schema}".agent_action_lane_intake(10)')
        conn.commit()
        with conn.transaction(force_rollback=True):
            # The claimer's own first claim of the kind: it walks the keys, after the one key
            # its round robin claimed over last.
            claim = claim_heads_statement(
                queries_for(schema),
                {"kind": "NOTE", "lease": timedelta(minutes=5), "take": False},
                100,
                None,
                {"NOTE": "w"},
            )
            claimed = conn.execute(claim.sql, claim.params).fetchall()
            (read,) = conn.execute(
                "SELECT pg_stat_get_xact_tuples_returned(%s::regclass)",
                (f'"{schema}".ix_agent_action_lane_ready',),
            ).fetchone()
        holder.rollback()
    assert [row[0] for row in claimed if row[0] is not None] != []
    assert dead <= read < 1.5 * dead, read
