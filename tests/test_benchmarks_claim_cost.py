"""The claim-cost scenario times what a claimer runs: the claim's statements prepared, every timed
run claiming the same heads from the same table (each run rolled back, nothing left behind)."""

from __future__ import annotations

import pytest

from benchmarks import claim_cost
from benchmarks.common import migrated_outbox


@pytest.fixture
def case(database_url, schema, monkeypatch):
    monkeypatch.setattr(claim_cost, "DATABASE_URL", database_url)
    migrated_outbox(schema, database_url)
    claim_cost.fill(schema, singles=150, hot=20)
    loaded = claim_cost.Case("claim-cost-test", "test", {"singles": 150}, schema, 0.0)
    yield loaded
    loaded.conn.close()


def read(case: claim_cost.Case, sql: str, *params: object) -> list[tuple]:
    """Rows of ``sql`` on the case's session, its transaction then ended as the claims end
    theirs (psycopg's own rollback would deallocate every prepared statement)."""
    rows = case.conn.execute(sql, params).fetchall()
    case.conn.pgconn.exec_(b"ROLLBACK")
    return rows


def prepared(case: claim_cost.Case) -> set[str]:
    """The statements the case's session holds prepared."""
    return {row[0] for row in read(case, "SELECT statement FROM pg_prepared_statements")}


def test_timed_claims_run_prepared_after_the_warm_up(case):
    for _ in range(claim_cost.WARM_UP):
        case.claim(timed=False)
    held = prepared(case)
    assert any("agent_action" in statement for statement in held), held
    case.claim(timed=True)
    # The claim's rollback left psycopg's statements prepared for the next run.
    assert prepared(case) >= held


def test_every_run_claims_the_same_heads_and_leaves_none_claimed(case):
    for _ in range(claim_cost.WARM_UP + 2):
        case.claim(timed=True)
        assert case.claimed == claim_cost.BATCH
    [(executing,)] = read(
        case, f'SELECT count(*) FROM "{case.schema}".agent_action WHERE state = %s', "EXECUTING"
    )
    assert executing == 0
    assert len(case.seconds) == claim_cost.WARM_UP + 2
