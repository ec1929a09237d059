"""The lanes scenario's checks and the peer comparison rows, without a database: a lane that ran
out of id order, an action run twice or never, or an enqueue plan that splits a lane between
enqueuers must not yield a number."""

from __future__ import annotations

import pytest

from benchmarks import lanes
from benchmarks.common import Result, Scale
from benchmarks.peers.compare import new_rows


def record(lane: str, id_: int, start: float, end: float, **changes: object) -> lanes.Record:
    fields = {"state": "DONE", "runs": 1, "created": 0.0, **changes}
    return lanes.Record(lane=lane, id=id_, start=start, end=end, **fields)  # type: ignore[arg-type]


def in_order() -> list[lanes.Record]:
    # Two lanes interleaved in time, each one at a time in id order.
    return [
        record("a", 1, 1.0, 2.0),
        record("b", 2, 1.5, 2.5),
        record("a", 3, 2.0, 3.0),
        record("b", 4, 2.6, 3.5),
    ]


def test_a_run_in_lane_order_passes():
    lanes.check(in_order(), 4, "lanes-2")


def test_a_lane_that_ran_a_later_id_first_fails():
    records = in_order()
    records[2] = record("a", 3, 0.5, 0.9)  # id 3 ran (and ended) before id 1 started
    with pytest.raises(AssertionError, match="lane a ran 3"):
        lanes.check(records, 4, "lanes-2")


def test_a_lane_that_overlapped_two_actions_fails():
    records = in_order()
    records[3] = record("b", 4, 2.4, 3.5)  # started before id 2 ended at 2.5
    with pytest.raises(AssertionError, match="lane b ran 4"):
        lanes.check(records, 4, "lanes-2")


@pytest.mark.parametrize(
    "changes", [{"runs": 2}, {"runs": 0}, {"state": "UNCERTAIN"}], ids=["twice", "never", "state"]
)
def test_an_action_not_done_exactly_once_fails(changes):
    records = in_order()
    records[1] = record("b", 2, 1.5, 2.5, **changes)
    with pytest.raises(AssertionError, match="not DONE exactly once"):
        lanes.check(records, 4, "lanes-2")


def test_a_missing_action_fails():
    with pytest.raises(AssertionError, match="3 actions, expected 4"):
        lanes.check(in_order()[:3], 4, "lanes-2")


@pytest.mark.parametrize(("n", "lane_count"), [(2_000, 50), (10_000, 1_000), (100, 5), (7, 3)])
def test_the_plan_enqueues_every_action_once_each_lane_by_one_enqueuer_in_order(n, lane_count):
    plan = lanes.plan(n, lane_count)
    assert len(plan) == lanes.ENQUEUERS
    seen = [i for batches in plan for batch in batches for i in batch]
    assert sorted(seen) == list(range(n))
    owner: dict[int, int] = {}
    for enqueuer, batches in enumerate(plan):
        assert all(0 < len(batch) <= lanes.PER_TX for batch in batches)
        mine = [i for batch in batches for i in batch]
        assert mine == sorted(mine)  # a lane's actions are enqueued in id order
        for i in mine:
            assert owner.setdefault(i % lane_count, enqueuer) == enqueuer


def test_a_tiny_run_keeps_several_actions_a_lane_under_the_same_names():
    shapes = list(lanes.shapes(Scale(quick=True, factor=0.01)))
    assert [name for name, _, _ in shapes] == ["lanes-50", "lanes-1000"]
    assert all(n >= 5 * lane_count for _, n, lane_count in shapes)
    full = list(lanes.shapes(Scale(quick=True)))
    assert [(n, lane_count) for _, n, lane_count in full] == [(2_000, 50), (10_000, 1_000)]


def row(scenario: str, per_s: float, p50: float | None, p99: float | None) -> Result:
    return Result(scenario, 100, per_s, p50, p99, 1.0, scenario)


def test_a_comparison_row_appears_once_both_rows_ran():
    emitted: set[str] = set()
    results = [row("lanes-1000", 3_000.0, 50.0, 90.0)]
    assert new_rows(results, emitted) == []
    results.append(row("procrastinate-lanes-1000", 300.0, 900.0, 2_000.0))
    (compared,) = new_rows(results, emitted)
    assert compared.scenario == "lanes-1000-vs-procrastinate"
    assert compared.ratio == 10.0
    assert compared.ratio_to == "procrastinate-lanes-1000"
    assert new_rows(results, emitted) == []


def test_a_latency_comparison_is_the_ratio_of_p50s():
    emitted: set[str] = set()
    results = [row("latency", 100.0, 8.0, 20.0), row("pgqueuer-latency", 100.0, 16.0, 80.0)]
    (compared,) = new_rows(results, emitted)
    assert compared.scenario == "latency-vs-pgqueuer"
    assert compared.ratio == 0.5
    assert compared.extra["p99_ratio"] == 0.25
