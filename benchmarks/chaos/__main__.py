"""``python -m benchmarks.chaos [--short] [--actions N] [--duration S] [--kill-interval S]
[--seed N] [--shared-servers] [--no-faults] [--fabric celery]``: the chaos soak (on the
Dramatiq fabric unless ``--fabric celery``). Prints its table on stdout; exits 1 when a check
failed. It runs on a PostgreSQL and a Redis of its own unless ``--shared-servers``
(then on ``--database-url`` and ``--broker-url``, without server restarts)."""

from __future__ import annotations

import argparse
import os
import sys

from benchmarks.chaos.soak import DEFAULT_BROKER_URL, DEFAULT_DATABASE_URL, Options, run

#: ``--short``: the CI version, about two and a half minutes end to end.
SHORT = {"actions": 2500, "duration": 40.0, "kill_interval": 3.0}
#: Without ``--short``: the long run (docs/chaos.md).
LONG = {"actions": 7000, "duration": 300.0, "kill_interval": 4.0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.chaos", description=__doc__)
    parser.add_argument("--short", action="store_true", help="the CI version (a few minutes)")
    parser.add_argument("--actions", type=int, help="actions to enqueue")
    parser.add_argument("--duration", type=float, help="seconds of enqueueing and kills")
    parser.add_argument("--kill-interval", type=float, help="mean seconds between SIGKILLs")
    parser.add_argument("--seed", type=int, default=1, help="the mix, kills and erasures")
    parser.add_argument("--erasures", type=int, help="accounts erased during the run")
    parser.add_argument("--keep", action="store_true", help="keep the run's schemas")
    parser.add_argument(
        "--shared-servers",
        action="store_true",
        help="run on --database-url and --broker-url instead of private servers (no restarts)",
    )
    parser.add_argument(
        "--no-faults",
        action="store_true",
        help="random SIGKILLs only: no server restart, no worker-pool outage",
    )
    parser.add_argument(
        "--fabric",
        choices=("dramatiq", "celery"),
        default="dramatiq",
        help="the dispatch fabric the fleet runs on (Celery: on the same Redis)",
    )
    parser.add_argument(
        "--database-url",
        default=os.environ.get("OUTBOX_CHAOS_DATABASE_URL", DEFAULT_DATABASE_URL),
    )
    parser.add_argument(
        "--broker-url",
        default=os.environ.get("OUTBOX_CHAOS_BROKER_URL", DEFAULT_BROKER_URL),
        help="with --shared-servers: a Redis database of the soak's own (it is flushed)",
    )
    args = parser.parse_args(argv)
    base = SHORT if args.short else LONG
    options = Options(
        actions=args.actions or base["actions"],
        duration=args.duration or base["duration"],
        kill_interval=args.kill_interval or base["kill_interval"],
        seed=args.seed,
        erasures=args.erasures if args.erasures is not None else (4 if args.short else 10),
        database_url=args.database_url,
        broker_url=args.broker_url,
        keep=args.keep,
        private_servers=not args.shared_servers,
        faults=not args.no_faults,
        fabric=args.fabric,
    )
    outcome = run(options)
    print(outcome.table, flush=True)
    print("CHAOS SOAK PASSED" if outcome.ok else "CHAOS SOAK FAILED", flush=True)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    sys.exit(main())
