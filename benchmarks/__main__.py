"""``python -m benchmarks [--quick] [--peers] [--only NAME ...]``: one JSON object per result on
stdout, a table on stderr, in the order the scenarios ran."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

from benchmarks import peers
from benchmarks.common import Result, Scale
from benchmarks.peers.compare import new_rows
from benchmarks.table import render

#: Scenario name -> the module that runs it (imported lazily: the broker scenarios need the
#: dispatch package).
SCENARIOS: dict[str, str] = {
    "claim-cost": "benchmarks.claim_cost",
    "claim-round": "benchmarks.claim_round",
    "enqueue": "benchmarks.enqueue",
    "inprocess": "benchmarks.inprocess",
    "executor-cost": "benchmarks.executor_cost",
    "dramatiq-raw": "benchmarks.dramatiq_raw",
    "e2e": "benchmarks.e2e",
    "payload": "benchmarks.e2e_payload",
    "celery-raw": "benchmarks.celery_raw",
    "e2e-celery": "benchmarks.e2e:run_celery",
    # The Dramatiq scenarios on RabbitMQ, against raw Dramatiq on the same RabbitMQ.
    "rabbitmq": "benchmarks.rabbitmq",
    "latency": "benchmarks.latency",
    "hot-lane": "benchmarks.hot_lane",
    # Scheduled actions (not_before) to an idle pool: how late each starts after its time.
    "scheduled": "benchmarks.scheduled",
    "wal": "benchmarks.wal",
    "priority": "benchmarks.limits:run_priority",
    "fair": "benchmarks.limits:run_fair",
    "rate": "benchmarks.limits:run_rate",
    # Lanes end to end, and the peers: other PostgreSQL job queues on the same server (the
    # `bench` extra; run by --peers or by name), each compared where the outbox has a twin.
    "lanes": "benchmarks.lanes",
    "pgqueuer-inprocess": "benchmarks.peers.pgqueuer_runs:run_inprocess",
    "pgqueuer-latency": "benchmarks.peers.pgqueuer_runs:run_latency",
    "procrastinate-latency": "benchmarks.peers.procrastinate_runs:run_latency",
    "procrastinate-lanes": "benchmarks.peers.procrastinate_runs:run_lanes",
    # A provider that takes 200 ms a call: throughput against the pool's concurrency, and the
    # memory an in-flight action costs the claimer and a worker process.
    "slow-provider": "benchmarks.slow_provider",
    "memory": "benchmarks.memory",
    # Nothing enqueued: the CPU and the statements a second of idle processes, and the peers'.
    "idle": "benchmarks.idle",
    "pgqueuer-idle": "benchmarks.peers.pgqueuer_runs:run_idle",
    "procrastinate-idle": "benchmarks.peers.procrastinate_runs:run_idle",
    # A backlog waiting while every process (re)starts: the time to the first and last start.
    "cold-start": "benchmarks.cold_start",
    # A large backlog left by an outage, then a claimer and a pool: does what waits slow them?
    "backlog": "benchmarks.backlog",
    # Another session holds a snapshot open while batches drain: what the dead rows cost.
    "horizon": "benchmarks.horizon",
    "pgqueuer-horizon": "benchmarks.peers.pgqueuer_runs:run_horizon",
    # The provider down while actions keep coming: the calls, the actions lost, the drain after.
    "provider-outage": "benchmarks.provider_outage",
    # PostgreSQL restarted under a steady load: how long until what it caught has ended.
    "db-restart": "benchmarks.db_restart",
    # The Redis broker restarted, without persistence, under a backlog: its cost over the drain.
    "broker-restart": "benchmarks.broker_restart",
    # Minutes of steady load with a short retention: latency and the table's size over time.
    "sustained": "benchmarks.sustained",
    # Rising steady loads: latency and CPU an action against the offered rate, to the knee.
    "load": "benchmarks.load",
}
#: The scenarios of other job queues: not in the default run.
PEERS = frozenset(peers.PACKAGES)
#: A scenario that runs in turns with its peer when a run has both, and the runner of the pairs
#: (which reports both rows and their comparison).
PAIRED = {"inprocess": ("pgqueuer-inprocess", "benchmarks.peers.paired")}


def runner(name: str) -> Callable[[Scale], list[Result]]:
    """The scenario's ``run`` (``module``, or ``module:function`` for one of several)."""
    path, _, function = SCENARIOS[name].partition(":")
    module = __import__(path, fromlist=[function or "run"])
    run: Callable[[Scale], list[Result]] = getattr(module, function or "run")
    return run


def planned(names: list[str]) -> list[tuple[str, Callable[[Scale], list[Result]]]]:
    """Each scenario of ``names`` with its runner, in order; a scenario whose peer is in
    ``names`` too runs in turns with it (``PAIRED``), in the scenario's place."""
    pairs = {ours: PAIRED[ours] for ours in names if ours in PAIRED and PAIRED[ours][0] in names}
    taken = {peer for peer, _ in pairs.values()}
    plan = []
    for name in names:
        if name in pairs:
            peer, path = pairs[name]
            module = __import__(path, fromlist=["run"])
            plan.append((f"{name} and {peer} in turns", module.run))
        elif name not in taken:
            plan.append((name, runner(name)))
    return plan


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a run of about two minutes")
    parser.add_argument(
        "--peers", action="store_true", help="also the peers (pgqueuer, procrastinate)"
    )
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), help="these scenarios")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every N (the smoke test: 0.01)"
    )
    args = parser.parse_args(argv)
    scale = Scale(quick=args.quick, factor=args.scale)
    names = args.only or [n for n in SCENARIOS if args.peers or n not in PEERS]
    unavailable = [why for why in map(peers.missing, names) if why]
    if unavailable:
        parser.error("; ".join(unavailable))
    results: list[Result] = []
    compared: set[str] = set()
    started = time.monotonic()
    for name, run in planned(names):
        scenario_started = time.monotonic()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        for result in run(scale):
            result.extra.setdefault("took_s", round(time.monotonic() - scenario_started, 1))
            print(json.dumps(result.as_json()), flush=True)
            results.append(result)
        for comparison in new_rows(results, compared):
            print(json.dumps(comparison.as_json()), flush=True)
            results.append(comparison)
    mode = "quick" if args.quick else "default"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"\n{mode} run, {stamp}, {time.monotonic() - started:.0f} s\n{render(results)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
