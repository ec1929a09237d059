"""The batched statements (group commit, ``enqueue_many``) cost a batch linear work, also in the
generic plan a prepared statement settles on after a few runs.

psycopg prepares a statement it has run five times; PostgreSQL then plans it once without the
parameters' values (a "generic plan", where ``unnest`` of an array parameter is guessed at ten
rows), and keeps that plan if it looks no dearer. A batched statement whose generic plan joins
the batch to a scan with a join filter compares every pair: 65,536 comparisons at a batch of
256. These tests run each statement as the server would after a few batches
(``plan_cache_mode = force_generic_plan``) at ``MAX_BATCH`` and count the rows its plan
visited, filtered out or compared (EXPLAIN ANALYZE): never a timing.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import run_sync
from outbox.batching import MAX_BATCH
from outbox.enqueuing import enqueue_many_operation
from outbox.queries import queries_for
from outbox.store import claim_operation
from tests.support import generic_plan, plan_nodes

NOTE = ActionKind("NOTE")
LEASE = timedelta(minutes=5)
#: Rows a plan may touch a batch row (probes, the history rows, the lane work): linear work is a
#: small constant a row; a join filter over the batch is MAX_BATCH a row.
PER_ROW = 12
#: Rows a plan may touch once a statement, whatever the batch (an InitPlan's row).
PER_STATEMENT = 8


def _visited(node: dict[str, Any]) -> int:
    """Rows a plan node produced, dropped by a filter or compared by a join filter, over all
    its loops, and its children's."""
    loops = node.get("Actual Loops", 1)
    own = sum(
        node.get(key, 0) * loops
        for key in ("Actual Rows", "Rows Removed by Filter", "Rows Removed by Join Filter")
    )
    return own + sum(_visited(child) for child in node.get("Plans", []))


def _action_probes(node: dict[str, Any]) -> int:
    """How many times the plan looked up agent_action by an index, over all loops."""
    own = 0
    if node.get("Relation Name") == "agent_action" and node["Node Type"] in (
        "Index Scan",
        "Index Only Scan",
        "Bitmap Heap Scan",
    ):
        own = node.get("Actual Loops", 1)
    return own + sum(_action_probes(child) for child in node.get("Plans", []))


def _request(i: int) -> ActionRequest:
    return ActionRequest(kind="NOTE", workspace_id="w", lane_key=f"l{i}", idempotency_key=f"k{i}")


def _claim_half(make_outbox, database_url, schema, *, analyze_first: bool):
    """Four times MAX_BATCH actions, half of them claimed by a claimer (not taken yet), beside
    a history of ended ones; the table analyzed after the claims, or (``analyze_first``) before
    them, when the planner's statistics still say that nothing is executing."""
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        # Ended rows as they are at rest (the guard refuses inserting an ended row, so triggers
        # are off for this bulk load, which needs a superuser).
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            f'INSERT INTO "{schema}".agent_action (kind, state, workspace_id, lane_key,'
            " idempotency_key, stop_reason, ended_at, attempt, epoch)"
            " SELECT 'NOTE', 'DONE', 'w', 'old-' || g, 'old-' || g, 'DONE', now(), 1, 1"
            " FROM generate_series(1, 20000) g"
        )
        conn.execute("SET session_replication_role = DEFAULT")
        enqueue_many(conn, [_request(i) for i in range(4 * MAX_BATCH)], schema=schema)
        if analyze_first:
            conn.execute(f'VACUUM ANALYZE "{schema}".agent_action')
        rows = []
        for _ in range(2):
            rows += run_sync(conn, claim_operation(schema, {"NOTE": MAX_BATCH}, LEASE, take=False))
        if not analyze_first:
            conn.execute(f'VACUUM ANALYZE "{schema}".agent_action')
    assert len(rows) == 2 * MAX_BATCH
    return [(c.action.id, c.action.epoch, c.action.lease_until) for c in rows]


@pytest.fixture
def claimed(make_outbox, database_url, schema):
    """Claims the planner knows of, as in production once the table was analyzed."""
    return _claim_half(make_outbox, database_url, schema, analyze_first=False)


@pytest.fixture
def claimed_unseen(make_outbox, database_url, schema):
    """Claims made after the last ANALYZE (a fresh table, or autovacuum not yet round): the
    planner guesses a single executing action."""
    return _claim_half(make_outbox, database_url, schema, analyze_first=True)


def _batch_params(claimed: list[tuple[int, int, Any]]) -> dict[str, dict[str, Any]]:
    n = len(claimed)
    ids = [c[0] for c in claimed]
    epochs = [c[1] for c in claimed]
    claimed_ats = [c[2] - LEASE for c in claimed]
    return {
        "take_attempts": {"ids": ids, "epochs": epochs, "lease": LEASE, "taker": ""},
        "release_claims": {"ids": ids, "epochs": epochs},
        "begin_writes": {
            "ids": ids,
            "epochs": epochs,
            "margins": [timedelta(0)] * n,
            "refs": [f"ref-{i}" for i in ids],  # every fence writes its history row
            "claimed_ats": claimed_ats,
        },
        "finish_many": {
            "ids": ids,
            "epochs": epochs,
            # Ends that park their payload and an end that does not, retries and deferrals.
            "states": [("UNCERTAIN", "DONE", "ADMITTED", "ADMITTED")[i % 4] for i in range(n)],
            "stop_reasons": [("LEASE_LOST", "DONE", None, None)[i % 4] for i in range(n)],
            "refs": ["ref"] * n,
            "retry_reasons": [(None, None, "BUSY", "LATER")[i % 4] for i in range(n)],
            "afters": [timedelta(seconds=1)] * n,
            "gives_back": [i % 4 == 3 for i in range(n)],
            "error_classes": [None] * n,
            "claimed_ats": claimed_ats,
            "fenced": [i % 2 == 0 for i in range(n)],
            # Every end looks for its lane's next action (the hand-off): a probe a row.
            "hand_offs": [LEASE] * n,
            # The retries count toward their kind's outage row.
            "retried": [i % 4 == 2 for i in range(n)],
            "taker": "",
        },
    }


@pytest.mark.parametrize("batch", [MAX_BATCH])
@pytest.mark.parametrize("name", ["take_attempts", "release_claims", "begin_writes", "finish_many"])
def test_a_group_committed_statement_visits_a_batch_row_a_few_times(
    claimed, database_url, schema, name, batch
):
    """At MAX_BATCH among as many executing actions again: a few rows a batch row."""
    params = _batch_params(claimed[:batch])[name]
    with psycopg.connect(database_url) as conn:
        _ready_for(conn, schema, name)
        plan = generic_plan(conn, queries_for(schema)[name], params)
    assert plan["Actual Rows"] == batch, plan
    assert _visited(plan) <= PER_ROW * batch + PER_STATEMENT, json.dumps(plan, indent=1)


def _ready_for(conn: psycopg.Connection[Any], schema: str, name: str) -> None:
    if name == "finish_many":
        # Workers took every claim, and every other attempt passed its fence (its finish
        # records the fence's time).
        conn.execute(
            f'UPDATE "{schema}".agent_action SET taken_epoch = epoch, attempt = attempt + 1,'
            " write_started_at = CASE WHEN id % 2 = 0 THEN now() END"
            " WHERE state = 'EXECUTING'"
        )
        conn.commit()


@pytest.mark.parametrize("mode", ["force_generic_plan", "force_custom_plan"])
@pytest.mark.parametrize("name", ["take_attempts", "release_claims", "begin_writes", "finish_many"])
def test_a_group_committed_statement_stays_linear_when_the_statistics_missed_the_claims(
    claimed_unseen, database_url, schema, name, mode
):
    """Statistics that say nothing executes make a scan of the executing rows look cheaper than
    a primary-key probe; each batch row must still reach its action by a probe of its own (a
    scan a batch row, or a nested loop over one, compares every pair). Also in the plan made
    for the batch's values (it knows the batch's size: a scan of a table of a few thousand rows
    costs less than as many probes), which each connection runs first."""
    params = _batch_params(claimed_unseen[:MAX_BATCH])[name]
    with psycopg.connect(database_url) as conn:
        _ready_for(conn, schema, name)
        plan = generic_plan(conn, queries_for(schema)[name], params, mode)
    assert plan["Actual Rows"] == MAX_BATCH, plan
    assert _visited(plan) <= PER_ROW * MAX_BATCH + PER_STATEMENT, json.dumps(plan, indent=1)
    assert _action_probes(plan) >= MAX_BATCH, json.dumps(plan, indent=1)


def test_a_take_finds_each_row_by_one_index_probe(claimed, database_url, schema):
    """The take reads the claim's lease (the history row's claim time) and updates the row
    with one primary-key probe a row: the update follows the probe's tuple id."""
    with psycopg.connect(database_url) as conn:
        plan = generic_plan(
            conn,
            queries_for(schema)["take_attempts"],
            _batch_params(claimed[:MAX_BATCH])["take_attempts"],
        )
    assert plan["Actual Rows"] == MAX_BATCH
    assert _action_probes(plan) == MAX_BATCH, json.dumps(plan, indent=1)


def test_enqueue_many_visits_a_request_a_few_times(make_outbox, database_url, schema):
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    requests = [_request(i) for i in range(MAX_BATCH)]
    with psycopg.connect(database_url) as conn:
        # Half the keys exist already: those requests insert nothing.
        enqueue_many(conn, requests[::2], schema=schema)
        conn.commit()
        n = len(requests)
        # The statement enqueue_many sends first, with its parameters, as the operation makes it.
        statement = next(enqueue_many_operation(schema, requests))
        plan = generic_plan(conn, statement.sql, dict(statement.params or {}))
    [insert] = plan_nodes(plan, "ModifyTable")
    assert insert["Actual Rows"] == n // 2, plan
    assert _visited(plan) <= PER_ROW * n + PER_STATEMENT, json.dumps(plan, indent=1)


def test_the_count_sees_a_join_filter_over_the_batch(claimed, database_url, schema):
    """The measure itself: the ``= ANY`` scan beside the join that once made the generic plan
    quadratic is counted far above the bound."""
    sql = queries_for(schema)["release_claims"].replace(
        "WHERE a.id = m.id", "WHERE a.id = ANY(%(ids)s::bigint[]) AND a.id + 0 = m.id + 0"
    )
    assert sql != queries_for(schema)["release_claims"]
    with psycopg.connect(database_url) as conn:
        plan = generic_plan(conn, sql, _batch_params(claimed[:MAX_BATCH])["release_claims"])
    assert plan["Actual Rows"] == MAX_BATCH
    assert _visited(plan) > 100 * MAX_BATCH, json.dumps(plan, indent=1)


def _trigger_plans(conn: psycopg.Connection[Any]) -> list[dict[str, Any]]:
    """Logs the plans of every statement the session runs, nested ones (triggers) included,
    with what they visited (auto_explain, which needs a superuser); returns the list they are
    appended to."""
    plans: list[dict[str, Any]] = []

    def keep(notice: psycopg.errors.Diagnostic) -> None:
        text = notice.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1]))

    conn.add_notice_handler(keep)
    conn.execute("LOAD 'auto_explain'")
    for setting in (
        "auto_explain.log_min_duration = 0",
        "auto_explain.log_analyze = on",
        "auto_explain.log_nested_statements = on",
        "auto_explain.log_format = json",
        "client_min_messages = log",
    ):
        conn.execute(f"SET {setting}")
    return plans


#: The lane tracker's query that pairs each row's old and new version (migration 0014).
_PAIRING = "GROUP BY v.id"
#: The guard's query that pairs them (migration 0020).
_GUARD_PAIRING = "FULL JOIN new_actions"


def test_the_lane_tracker_pairs_no_rows_for_a_take_or_a_fence(claimed, database_url, schema):
    """A take and a fence keep every row EXECUTING: the lane tracker ends at its first look,
    without pairing the rows' versions; a finish, which moves lanes, is still paired."""
    params = _batch_params(claimed[:MAX_BATCH])
    q = queries_for(schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        plans = _trigger_plans(conn)
        for name in ("take_attempts", "begin_writes"):
            assert len(conn.execute(q[name], params[name]).fetchall()) == MAX_BATCH
        paired = [p["Query Text"] for p in plans if _PAIRING in p["Query Text"]]
        assert paired == [], paired
        looked = [
            p
            for p in plans
            if "old_actions" in p["Query Text"] and _GUARD_PAIRING not in p["Query Text"]
        ]
        assert len(looked) == 2, [p["Query Text"] for p in plans]
        assert all(_visited(p["Plan"]) <= 2 * MAX_BATCH + PER_STATEMENT for p in looked)
        assert len(conn.execute(q["finish_many"], params["finish_many"]).fetchall()) == MAX_BATCH
        assert any(_PAIRING in p["Query Text"] for p in plans)


def test_the_lane_tracker_stays_linear_after_a_small_first_statement(
    make_outbox, database_url, schema
):
    """plpgsql plans a query without parameters once a session, for the size of the transition
    tables at its first call: the lane tracker's and the guard's pairing queries, planned for a
    claim of one action, must still visit a later claim's MAX_BATCH rows a few times each (a
    join of the two transition tables planned for one row compares every pair)."""
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        enqueue_many(conn, [_request(i) for i in range(MAX_BATCH + 1)], schema=schema)
        plans = _trigger_plans(conn)
        for limit in (1, MAX_BATCH):
            with conn.transaction():
                claimed = run_sync(
                    conn, claim_operation(schema, {"NOTE": limit}, LEASE, take=False)
                )
            assert len(claimed) == limit
    for pairing in (_PAIRING, _GUARD_PAIRING):
        tracked = [p for p in plans if pairing in p["Query Text"]]
        assert len(tracked) == 2, [p["Query Text"] for p in plans]
        batch_plan = tracked[-1]["Plan"]
        assert _visited(batch_plan) <= PER_ROW * MAX_BATCH + PER_STATEMENT, json.dumps(
            batch_plan, indent=1
        )
