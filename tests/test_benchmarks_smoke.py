"""The benchmark harness works: every scenario runs end to end with a tiny N, prints one JSON
object per result with the keys the report promises, and leaves no schema and no Redis key of
its run behind (runs at the same time never touch each other's).

No timing is asserted (this machine is shared): only that the numbers exist and are sane. The
peer scenarios need the ``bench`` extra (``make install`` installs it): without it they are
skipped, and fail in CI, where a skipped peer would be a test that ran nothing.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pika
import psycopg
import pytest
import redis

from benchmarks import latency, peers, server_time
from benchmarks.__main__ import SCENARIOS
from benchmarks.peers import paired
from benchmarks.rig import run_queues
from tests.services import missing_service

REPO = Path(__file__).resolve().parent.parent
KEYS = {"scenario", "n", "actions_per_s", "p50_ms", "p99_ms", "ratio", "ratio_to"}
#: Rows that measure throughput only (no latency of their own: p50/p99 are null).
THROUGHPUT_ONLY = {"pgqueuer-inprocess", "pgqueuer-horizon", "dramatiq-raw-payload"}
#: Rows that run the outbox's processes and report the CPU ms an action of each and in all.
CPU_REPORTED = {
    "e2e",
    "e2e-single",
    "e2e-payload",
    "e2e-celery",
    "latency",
    "latency-8-kinds",
    "sustained",
    "load-50",
    "load-100",
    "e2e-rabbitmq",
    "latency-rabbitmq",
    "backlog-small",
    "backlog-large",
}
#: Rows of processes left with nothing to do: no rate and no latency, the CPU and the
#: statements a second instead.
IDLE = {"idle", "pgqueuer-idle", "procrastinate-idle"}
#: Scenarios whose broker is RabbitMQ (the rest run on Redis).
ON_RABBITMQ = {"rabbitmq"}


#: The benchmarks' Redis database (as in benchmarks/common.py), on the test suite's Redis.
BENCH_REDIS_DB = "/14"


def bench_redis_url(redis_url: str) -> str:
    return urlparse(redis_url)._replace(path=BENCH_REDIS_DB).geturl()


def run_benchmarks(
    run_id: str, database_url: str, redis_url: str, *args: str, amqp_url: str | None = None
) -> tuple[list[dict], str]:
    amqp = {"OUTBOX_BENCH_AMQP_URL": amqp_url} if amqp_url else {}
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks", "--quick", "--scale", "0.01", *args],
        cwd=REPO,
        env={
            **os.environ,
            "OUTBOX_BENCH_RUN_ID": run_id,
            "OUTBOX_BENCH_DATABASE_URL": database_url,
            "OUTBOX_BENCH_REDIS_URL": bench_redis_url(redis_url),
            **amqp,
        },
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()], done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_each_scenario_reports_every_key_and_drops_its_schema(
    name, database_url, redis_url, request
):
    if why := peers.missing(name):
        missing_service(why)
    amqp_url = request.getfixturevalue("rabbitmq_url") if name in ON_RABBITMQ else None
    run_id = f"smoke_{uuid.uuid4().hex[:8]}"
    rows, table = run_benchmarks(run_id, database_url, redis_url, "--only", name, amqp_url=amqp_url)
    assert rows, table
    if name == "enqueue":
        assert [row["scenario"] for row in rows][-2:] == [
            "enqueue-first",
            "enqueue-concurrent",
        ], table
    for row in rows:
        assert row.keys() >= KEYS, row
        # A row is named after its scenario (the RabbitMQ rows after what they repeat).
        assert row["scenario"].startswith(name) or row["scenario"].endswith(f"-{name}"), row
        assert row["n"] > 0
        if row["scenario"] in IDLE:
            assert_idle_row(row)
            assert row["scenario"] in table
            continue
        assert row["actions_per_s"] > 0
        if row["scenario"] not in THROUGHPUT_ONLY:
            assert 0 <= row["p50_ms"] <= row["p99_ms"]
        # The lanes scenarios (ours and procrastinate's) enqueue while the pool runs: no error.
        assert row.get("enqueue_errors", 0) == 0, row
        assert row["ratio"] > 0 and math.isfinite(row["ratio"])
        if row["scenario"] == "scheduled":
            assert row["early"] == 0, row  # none started before its not_before
        if row["scenario"] in CPU_REPORTED:
            assert row["postgres_cpu_ms_per_action"] > 0, row
            assert row["total_cpu_ms_per_action"] >= row["postgres_cpu_ms_per_action"], row
        if row["scenario"].startswith("slow-provider") and row["cpu_bound_per_s"] is not None:
            # The rate the cores would carry at the CPU an action in all (not counted twice).
            carried = (os.cpu_count() or 1) * 1000 / row["total_cpu_ms_per_action"]
            assert row["cpu_bound_per_s"] == pytest.approx(carried, rel=0.02), row
        if name in ON_RABBITMQ:
            # Its ceiling is raw Dramatiq on the same RabbitMQ, whose CPU is counted too.
            assert row["broker"] == "rabbitmq" and "rabbitmq_cpu_ms_per_action" in row, row
            assert row["ratio_to"].startswith("dramatiq-raw-rabbitmq"), row
        if row["scenario"].startswith("latency"):
            # Where the latency goes: every span was measured (the first compares the client's
            # clock after its commit with the claim's start, so it may be a hair below zero).
            spans = [row[name] for name in latency.PHASES]
            assert all(span is not None and math.isfinite(span) for span in spans), row
            assert all(row[name] >= 0 for name in latency.PHASES[1:]), row
        if row["scenario"].startswith("latency") and server_time.may_track(database_url):
            # Every session's counts were in before they were read: one enqueue a transaction
            # is one call of the insert trigger an action, and every action was claimed.
            functions = row["server_functions"]
            assert functions["agent_action_inserted"]["calls"] == 1.0, functions
            assert functions["agent_action_lanes_moved"]["calls"] > 0, functions
        if row["scenario"] == "enqueue-first":
            # Each side's first and second write on a new connection, and the connections.
            assert row["ceiling_p50_ms"] > 0 and row["ceiling_second_p50_ms"] > 0, row
            assert row["second_p50_ms"] > 0 and row["connect_p50_ms"] > 0, row
        if row["scenario"] in ("horizon", "pgqueuer-horizon"):
            # Both sides drained every batch, the held side with its snapshot open throughout.
            assert len(row["held_per_s"]) == len(row["free_per_s"]) == row["batches"], row
            assert row["held_s"] > 0 and row["released_per_s"] > 0, row
        if row["scenario"] == "horizon":
            assert row["held_claim_buffers"] > 0 and row["free_claim_buffers"] > 0, row
        if row["scenario"] == "enqueue-concurrent":
            # Many client processes at once, against plain inserts with and without a NOTIFY.
            assert row["clients"] > 1 and row["n"] > row["clients"], row
            assert row["ceiling_per_s"] > 0 and row["notify_ceiling_per_s"] > 0, row
            assert row["notify_ceiling_p50_ms"] >= 0, row
            # And the enqueue with its NOTIFY turned off (outbox.enqueue_notify).
            assert row["quiet_per_s"] > 0 and row["quiet_p50_ms"] >= 0, row
        if row["scenario"] == "inprocess" and server_time.may_track(database_url):
            # The drain's sessions only: its claims folded the intake and moved the lanes,
            # and the enqueue before the clock was not counted.
            functions = row["server_functions"]
            assert functions["agent_action_lane_intake"]["calls"] > 0, functions
            assert functions["agent_action_lanes_moved"]["calls"] > 0, functions
            assert "agent_action_inserted" not in functions, functions
        assert row["scenario"] in table
    assert_nothing_left(run_id, database_url, redis_url)
    if amqp_url:
        assert_no_queue_left(amqp_url, run_id)


@pytest.mark.slow
def test_inprocess_and_its_peer_drain_in_turns_and_compare_by_the_median_pair(
    database_url, redis_url
):
    if why := peers.missing("pgqueuer-inprocess"):
        missing_service(why)
    run_id = f"smoke_{uuid.uuid4().hex[:8]}"
    rows, table = run_benchmarks(
        run_id, database_url, redis_url, "--only", "inprocess", "pgqueuer-inprocess"
    )
    by_name = {row["scenario"]: row for row in rows}
    assert list(by_name) == ["inprocess", "pgqueuer-inprocess", "inprocess-vs-pgqueuer"], table
    ours, peer, compared = by_name.values()
    pairs = paired.ROUNDS[0]  # a quick run
    assert len(ours["rounds_per_s"]) == len(peer["rounds_per_s"]) == pairs
    ratios = [o / p for o, p in zip(ours["rounds_per_s"], peer["rounds_per_s"], strict=True)]
    assert compared["round_ratios"] == [round(r, 3) for r in ratios]
    assert compared["ratio"] == round(statistics.median(ratios), 3)
    # The rows are the median pair's, and ours still has its ceiling.
    median_pair = sorted(range(pairs), key=ratios.__getitem__)[pairs // 2]
    assert ours["actions_per_s"] == ours["rounds_per_s"][median_pair]
    assert peer["actions_per_s"] == peer["rounds_per_s"][median_pair]
    assert compared["peer_per_s"] == peer["actions_per_s"]
    assert ours["ratio_to"].startswith("pgbench") and ours["ceiling_per_s"] > 0
    assert_nothing_left(run_id, database_url, redis_url)


def assert_idle_row(row: dict) -> None:
    """An idle row: the seconds watched, each process tree's and service's share of a core and
    their sum (and as the fraction of a core it is, the ratio), the transactions and Redis
    commands a second; no rate or latency."""
    assert row["actions_per_s"] is None and row["p50_ms"] is None and row["p99_ms"] is None, row
    assert row["window_s"] > 0, row
    shares = [
        value for key, value in row.items() if key.endswith("_cpu_pct") and key != "total_cpu_pct"
    ]
    assert len(shares) >= 3 and all(share >= 0 for share in shares), row
    assert row["total_cpu_pct"] == pytest.approx(sum(shares), abs=0.01), row
    assert row["total_cpu_pct"] > 0, row
    assert row["ratio"] == pytest.approx(row["total_cpu_pct"] / 100, abs=1e-4), row
    assert row["ratio_to"] == "one-core", row
    assert row["pg_xacts_per_s"] >= 0 and row["redis_commands_per_s"] >= 0, row


@pytest.mark.slow
def test_idle_processes_are_compared_with_each_idle_peer(database_url, redis_url):
    for name in ("pgqueuer-idle", "procrastinate-idle"):
        if why := peers.missing(name):
            missing_service(why)
    run_id = f"smoke_{uuid.uuid4().hex[:8]}"
    rows, table = run_benchmarks(
        run_id, database_url, redis_url, "--only", "idle", "pgqueuer-idle", "procrastinate-idle"
    )
    by_name = {row["scenario"]: row for row in rows}
    assert list(by_name) == [
        "idle",
        "pgqueuer-idle",
        "idle-vs-pgqueuer",
        "procrastinate-idle",
        "idle-vs-procrastinate",
    ], table
    ours = by_name["idle"]
    assert {"claimer_cpu_pct", "workers_cpu_pct", "redis_cpu_pct"} <= ours.keys(), ours
    assert "workers_cpu_pct" in by_name["procrastinate-idle"], by_name["procrastinate-idle"]
    for peer in ("pgqueuer", "procrastinate"):
        compared, theirs = by_name[f"idle-vs-{peer}"], by_name[f"{peer}-idle"]
        expected = ours["total_cpu_pct"] / theirs["total_cpu_pct"]
        assert compared["ratio"] == pytest.approx(expected, abs=0.001), compared
        assert compared["peer_pg_xacts_per_s"] == theirs["pg_xacts_per_s"], compared
    assert_nothing_left(run_id, database_url, redis_url)


@pytest.mark.slow
def test_the_held_horizon_drain_is_compared_with_pgqueuers(database_url, redis_url):
    if why := peers.missing("pgqueuer-horizon"):
        missing_service(why)
    run_id = f"smoke_{uuid.uuid4().hex[:8]}"
    rows, table = run_benchmarks(
        run_id, database_url, redis_url, "--only", "horizon", "pgqueuer-horizon"
    )
    by_name = {row["scenario"]: row for row in rows}
    assert list(by_name) == ["horizon", "pgqueuer-horizon", "horizon-vs-pgqueuer"], table
    ours, theirs = by_name["horizon"], by_name["pgqueuer-horizon"]
    assert ours["batches"] == theirs["batches"] and ours["per_batch"] == theirs["per_batch"]
    compared = by_name["horizon-vs-pgqueuer"]
    expected = ours["actions_per_s"] / theirs["actions_per_s"]
    assert compared["ratio"] == pytest.approx(expected, abs=0.001), compared
    assert_nothing_left(run_id, database_url, redis_url)


def assert_nothing_left(run_id: str, database_url: str, redis_url: str) -> None:
    """No schema and no Redis key of the run is left behind."""
    with psycopg.connect(database_url) as conn:
        left = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE nspname LIKE %s", (f"bench%{run_id}",)
        ).fetchall()
    assert left == []
    with redis.Redis.from_url(bench_redis_url(redis_url)) as client:
        assert list(client.scan_iter(match=f"*{run_id}*")) == []


def assert_no_queue_left(amqp_url: str, run_id: str) -> None:
    """No RabbitMQ queue of the run is left behind (a passive declare of a queue that does not
    exist closes the channel with 404)."""
    connection = pika.BlockingConnection(pika.URLParameters(amqp_url))
    try:
        left = []
        for name in run_queues(run_id):
            channel = connection.channel()
            try:
                channel.queue_declare(name, passive=True)
                left.append(name)
                channel.close()
            except pika.exceptions.ChannelClosedByBroker as closed:
                assert closed.reply_code == 404, closed
    finally:
        connection.close()
    assert left == []
