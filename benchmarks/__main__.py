"""``python -m benchmarks [--quick] [--only NAME ...]``: one JSON object per result on stdout,
a table on stderr, in the order the scenarios ran."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime

from benchmarks.common import Result, Scale
from benchmarks.table import render

#: Scenario name -> the module that runs it (imported lazily: the broker scenarios need the
#: dispatch package).
SCENARIOS: dict[str, str] = {
    "claim-cost": "benchmarks.claim_cost",
    "enqueue": "benchmarks.enqueue",
    "inprocess": "benchmarks.inprocess",
    "dramatiq-raw": "benchmarks.dramatiq_raw",
    "e2e": "benchmarks.e2e",
    "celery-raw": "benchmarks.celery_raw",
    "e2e-celery": "benchmarks.e2e:run_celery",
    "latency": "benchmarks.latency",
    "hot-lane": "benchmarks.hot_lane",
    "wal": "benchmarks.wal",
    "priority": "benchmarks.limits:run_priority",
    "fair": "benchmarks.limits:run_fair",
    "rate": "benchmarks.limits:run_rate",
    # A provider that takes 200 ms a call: throughput against the pool's concurrency, and the
    # memory an in-flight action costs the claimer and a worker process.
    "slow-provider": "benchmarks.slow_provider",
    "memory": "benchmarks.memory",
}


def runner(name: str) -> Callable[[Scale], list[Result]]:
    """The scenario's ``run`` (``module``, or ``module:function`` for one of several)."""
    path, _, function = SCENARIOS[name].partition(":")
    module = __import__(path, fromlist=[function or "run"])
    run: Callable[[Scale], list[Result]] = getattr(module, function or "run")
    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a run of about two minutes")
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), help="these scenarios")
    parser.add_argument(
        "--scale", type=float, default=1.0, help="multiply every N (the smoke test: 0.01)"
    )
    args = parser.parse_args(argv)
    scale = Scale(quick=args.quick, factor=args.scale)
    results: list[Result] = []
    started = time.monotonic()
    for name in args.only or list(SCENARIOS):
        scenario_started = time.monotonic()
        print(f"running {name} ...", file=sys.stderr, flush=True)
        for result in runner(name)(scale):
            result.extra.setdefault("took_s", round(time.monotonic() - scenario_started, 1))
            print(json.dumps(result.as_json()), flush=True)
            results.append(result)
    mode = "quick" if args.quick else "default"
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    print(
        f"\n{mode} run, {stamp}, {time.monotonic() - started:.0f} s\n{render(results)}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
