"""The lane bookkeeping (the fold, the lane tracker a claim's or a finish's statement fires, the
refresh of a lane) costs a statement work in proportion to the lanes it touches, whatever size
the lane table grew to after the plans were made.

The lane functions plan once a session (``plan_cache_mode = force_generic_plan``), and a lane
table that keeps rows only while actions wait is usually near empty when it is analyzed: its
statistics then say "pages, but no rows", and the planner, which scales the row count by the
table's pages, estimates a single row however large the table grows before the next ANALYZE.
A plan that joins the lanes a statement touches to a scan of the lane table is then as cheap in
its eyes as a probe a lane, and under a backlog (tens of thousands of waiting lanes) it compares
every lane row with every lane of the statement: a claimer's round of 96 took 0.2 to 1.3 s and
throughput fell to a third of capacity. These tests make the plans in a session while the
statistics say the table is empty, grow the table, and count the rows each plan of the lane
functions visited (``auto_explain`` at NOTICE level, plans of nested statements included):
never a timing.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import Statement, run_sync
from outbox.config import Settings
from outbox.dispatch.claim_guard import guard_statement
from outbox.dispatch.claimer import bounded_claim_operation
from outbox.dispatch.consumption import ConsumptionWatch
from outbox.queries import queries_for
from outbox.store import claim_heads_statement, claim_operation
from tests.support import ScriptedAdapter, expected_lanes, generic_plan, plan_nodes

NOTE = ActionKind("NOTE")
LEASE = timedelta(minutes=5)
#: Waiting lanes the table holds when the plans made over an empty one run.
BACKLOG = 3_000
#: Lanes a statement under test touches.
BATCH = 50
#: Rows a plan node may visit a lane of its statement (probes, the lane's actions, a lock).
PER_LANE = 12
#: Rows a plan node may visit once a statement.
PER_STATEMENT = 8
#: The tables whose scans grow with the backlog.
LANE_TABLES = ("agent_action_lane", "agent_action_lane_intake")


@pytest.fixture
def ob(make_outbox):
    outbox = make_outbox()
    outbox.register(NOTE, ScriptedAdapter())
    outbox.migrate()
    return outbox


def _request(lane: str, key: str) -> ActionRequest:
    return ActionRequest(NOTE, lane_key=lane, idempotency_key=key, workspace_id="w")


def _fold(conn: psycopg.Connection[Any], schema: str, limit: int) -> int:
    (taken,) = conn.execute(f'SELECT "{schema}".agent_action_lane_intake(%s)', (limit,)).fetchone()
    conn.commit()
    return int(taken)


def _claim(conn: psycopg.Connection[Any], schema: str, n: int) -> list[int]:
    """A claimer's round of up to ``n``: its guard, its first look (the fold, the counts),
    its claim, in one transaction."""
    guard = guard_statement(schema, Settings())
    conn.execute(guard.sql, guard.params)
    operation = bounded_claim_operation(
        schema, [NOTE.name], 10 * n, n, LEASE, ConsumptionWatch(), locked=True
    )
    claimed = run_sync(conn, operation).claimed
    conn.commit()
    return [c.action.id for c in claimed]


def _end(conn: psycopg.Connection[Any], schema: str, ids: list[int]) -> None:
    """The actions end DONE in one statement (a finish's), committed."""
    conn.execute(
        f"UPDATE \"{schema}\".agent_action SET state = 'DONE', stop_reason = 'DONE',"
        " payload = NULL, ended_at = now() WHERE id = ANY (%s) AND state = 'EXECUTING'",
        (ids,),
    )
    conn.commit()


def _lanes(n: int, prefix: str, per_lane: int) -> list[ActionRequest]:
    return [_request(f"{prefix}{i}", f"{prefix}{i}-{j}") for i in range(n) for j in range(per_lane)]


@contextmanager
def explained(conn: psycopg.Connection[Any]) -> Iterator[list[dict[str, Any]]]:
    """The plans (JSON, with actual rows) of every statement ``conn`` runs in the block,
    nested ones (a trigger's, a function's) included."""
    plans: list[dict[str, Any]] = []

    def keep(diagnostic: psycopg.errors.Diagnostic) -> None:
        message = diagnostic.message_primary or ""
        if "plan:" in message:
            explained = json.loads(message.split("plan:", 1)[1])
            plans.append({**explained["Plan"], "Query Text": explained.get("Query Text", "")})

    settings = {
        "auto_explain.log_min_duration": "0",
        "auto_explain.log_analyze": "on",
        "auto_explain.log_timing": "off",
        "auto_explain.log_nested_statements": "on",
        "auto_explain.log_format": "json",
        "auto_explain.log_level": "notice",
    }
    conn.execute("LOAD 'auto_explain'")
    for name, value in settings.items():
        conn.execute(f"SET {name} = '{value}'")
    conn.add_notice_handler(keep)
    try:
        yield plans
    finally:
        conn.remove_notice_handler(keep)
        conn.execute("SET auto_explain.log_min_duration = -1")
        conn.commit()


def _worst(node: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """The most rows one node of the plan produced, filtered out or compared by a join filter
    over all its loops, of the nodes that scan a lane table or join (a join filter over a scan
    of one compares every pair), and that node."""
    loops = node.get("Actual Loops", 1)
    own = 0
    if node.get("Relation Name") in LANE_TABLES or "Join Filter" in node:
        own = sum(
            node.get(key, 0) * loops
            for key in ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter")
        )
    worst = (own, node)
    for child in node.get("Plans", []):
        worst = max(worst, _worst(child), key=lambda pair: pair[0])
    return worst


def _assert_linear(plans: list[dict[str, Any]], lanes: int) -> None:
    assert plans, "auto_explain reported no plan"
    # No plan fell back on a sequential scan where the lane functions turn them off (its cost
    # carries a penalty of 1e10, and a plan that costly is compiled by JIT: most of a second).
    dear = [plan["Query Text"] for plan in plans if plan["Total Cost"] >= 1e9]
    assert not dear, dear
    bound = PER_LANE * lanes + PER_STATEMENT
    over = [(rows, node, plan["Query Text"]) for plan in plans for rows, node in [_worst(plan)]]
    over = [(rows, node, text) for rows, node, text in over if rows > bound]
    assert not over, "\n\n".join(
        f"{rows} rows in\n{json.dumps(node, indent=1)}\nof\n{text}" for rows, node, text in over
    )


@pytest.fixture
def planned_over_an_empty_lane_table(ob, conn, database_url):
    """``conn``'s session planned the lane functions while the lane table's statistics said it
    has pages but no rows (lanes came and went, then ANALYZE); then ``BACKLOG`` lanes came to
    wait (two actions each, folded in another session), with no ANALYZE since."""
    schema = ob.schema
    # The server settles on a statement's generic plan after a few runs when it looks no
    # dearer than the custom ones; here it always does.
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.commit()
    churn = enqueue_many(conn, _lanes(BATCH, "churn", 1), schema=schema)
    conn.commit()
    _fold(conn, schema, 1_000)
    _end(conn, schema, _claim(conn, schema, BATCH))
    assert len(churn) == BATCH and expected_lanes(conn, schema) == []
    conn.rollback()
    conn.execute(f'ANALYZE "{schema}".agent_action_lane, "{schema}".agent_action_lane_intake')
    conn.commit()
    # Each lane function runs here, so that its plans are made now; and a claimer's claims
    # run often: psycopg prepares the claim, and PostgreSQL settles on a generic plan, made
    # now too (a round with nothing waiting sends no claim).
    warm = enqueue_many(conn, _lanes(1, "warm", 24), schema=schema)
    conn.commit()
    _fold(conn, schema, 1_000)
    for _ in range(2 * 12):
        (claimed,) = _claim(conn, schema, BATCH)  # one lane: an action a round
        _end(conn, schema, [claimed])
    assert expected_lanes(conn, schema) == [] and len(warm) == 24
    conn.rollback()  # a round begins its own transaction
    with psycopg.connect(database_url) as other:
        enqueue_many(other, _lanes(BACKLOG, "backlog", 2), schema=schema)
        other.commit()
        assert _fold(other, schema, 10 * BACKLOG) == BACKLOG
    return schema


def test_a_claim_and_its_end_visit_a_few_rows_a_lane_however_many_lanes_wait(
    planned_over_an_empty_lane_table, conn
):
    schema = planned_over_an_empty_lane_table
    with explained(conn) as plans:
        claimed = _claim(conn, schema, BATCH)
    assert len(claimed) == BATCH
    _assert_linear(plans, BATCH)
    with explained(conn) as plans:
        _end(conn, schema, claimed)
    _assert_linear(plans, BATCH)
    assert expected_lanes(conn, schema) == sorted(
        conn.execute(
            f'SELECT lane_key, head_id, head_kind, head_due_at, executing_id FROM "{schema}"'
            ".agent_action_lane ORDER BY lane_key"
        ).fetchall()
    )


def test_a_fold_visits_a_few_rows_a_lane_however_many_lanes_wait(
    planned_over_an_empty_lane_table, conn
):
    schema = planned_over_an_empty_lane_table
    enqueue_many(conn, _lanes(BATCH, "fresh", 2), schema=schema)
    conn.commit()
    with explained(conn) as plans:
        assert _fold(conn, schema, 1_000) == BATCH
    _assert_linear(plans, BATCH)


def test_an_in_process_claim_visits_a_few_rows_a_lane_however_many_lanes_wait(
    ob, conn, database_url
):
    """The in-process executor's claim (the fold, then the claim that is also the take, in one
    transaction), planned while the lane table looked empty."""
    schema = ob.schema
    conn.execute("SET plan_cache_mode = force_generic_plan")
    conn.commit()

    def claim(n: int) -> list[int]:
        operation = claim_operation(schema, {NOTE.name: n}, LEASE, take=True)
        claimed = run_sync(conn, operation)
        conn.commit()
        return [c.action.id for c in claimed]

    enqueue_many(conn, _lanes(BATCH, "churn", 1), schema=schema)
    conn.commit()
    _end(conn, schema, claim(BATCH))
    conn.execute(f'ANALYZE "{schema}".agent_action_lane, "{schema}".agent_action_lane_intake')
    enqueue_many(conn, _lanes(1, "warm", 24), schema=schema)
    conn.commit()
    for _ in range(24):
        _end(conn, schema, claim(BATCH))
    enqueue_many(conn, _lanes(BACKLOG, "backlog", 2), schema=schema)
    conn.commit()
    with psycopg.connect(database_url) as other:
        assert _fold(other, schema, 10 * BACKLOG) == BACKLOG
    with explained(conn) as plans:
        claimed = claim(BATCH)
    assert len(claimed) == BATCH
    _assert_linear(plans, BATCH)


@pytest.mark.parametrize("opening", ["claim_round_guard", "lane_intake"])
def test_a_claims_generic_plan_made_over_a_lane_table_analyzed_empty_scans_no_table(
    ob, conn, opening
):
    """The plan a prepared claim keeps, made when the lane table had a page and no rows: in a
    claimer's round (opened by its guard) and in an in-process claim (opened by the fold), it
    reaches the lane table through its indexes alone."""
    schema = ob.schema
    enqueue_many(conn, _lanes(BATCH, "churn", 1), schema=schema)
    conn.commit()
    claimed = run_sync(conn, claim_operation(schema, {NOTE.name: BATCH}, LEASE, take=True))
    conn.commit()
    _end(conn, schema, [c.action.id for c in claimed])
    _fold(conn, schema, 1_000)
    conn.execute(f'ANALYZE "{schema}".agent_action_lane')
    (pages, rows) = conn.execute(
        "SELECT relpages, reltuples FROM pg_class WHERE oid = %s::regclass",
        (f'"{schema}".agent_action_lane',),
    ).fetchone()
    assert pages >= 1 and rows == 0
    conn.commit()
    first = {
        "claim_round_guard": guard_statement(schema, Settings()),
        "lane_intake": Statement(queries_for(schema)["lane_intake"], {"limit": 1_000}),
    }[opening]
    conn.execute(first.sql, first.params)
    claim = claim_heads_statement(
        queries_for(schema),
        {"kind": NOTE.name, "limit": BATCH, "lease": LEASE, "take": opening == "lane_intake"},
        BATCH,
        None,
        {},
    )
    plan = generic_plan(conn, claim.sql, dict(claim.params or {}))
    conn.rollback()
    scans = [node.get("Relation Name") for node in plan_nodes(plan, "Seq Scan")]
    assert scans == [], json.dumps(plan, indent=1)
    assert plan["Total Cost"] < 1e9
