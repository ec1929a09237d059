"""``outbox health [--role claimer|worker]``: the probe a container healthcheck or a Kubernetes
exec probe runs (exit 0 healthy, 1 not), from the health files in ``$OUTBOX_HEALTH_DIR``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from outbox.config import health_dir_from_env
from outbox.errors import ConfigurationError
from outbox.health.probe import ROLES, present_verdict, role_verdict


def _cmd_health(args: argparse.Namespace) -> int:
    directory = args.dir or health_dir_from_env()
    if not directory:
        raise ConfigurationError(
            "no health directory: set OUTBOX_HEALTH_DIR (as the claimer and worker have it) or "
            "pass --dir"
        )
    if args.role:
        verdict = role_verdict(Path(directory), args.role)
    else:
        verdict = present_verdict(Path(directory))
    good = verdict.live if args.live else verdict.ready
    if args.json:
        reasons = list(verdict.reasons)
        print(json.dumps({"live": verdict.live, "ready": verdict.ready, "reasons": reasons}))
    else:
        print(f"{args.role or 'outbox'}: {verdict.line()}")
    return 0 if good else 1


def setup_health(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "health",
        help="exit 0 if the claimer (or worker pool) here is ready (--live: live), else 1",
    )
    p.add_argument(
        "--role",
        choices=ROLES,
        help="which processes to judge (default: every role with a process running here)",
    )
    p.add_argument("--live", action="store_true", help="judge liveness only (not readiness)")
    p.add_argument("--dir", help="the health directory (default: $OUTBOX_HEALTH_DIR)")
    p.add_argument("--json", action="store_true", help="print the verdict as JSON")
    p.set_defaults(func=_cmd_health)
