"""Peers: other PostgreSQL job queues measured in the same run as the outbox, on the same server.

Each peer installs its own tables into a schema of its own (``bench_<scenario>_<run id>``,
dropped afterwards, as every scenario's) and notifies on channels named after that schema, so
it never touches another run's objects. They need the ``bench`` extra
(``pip install -e '.[bench]'``); ``python -m benchmarks --peers`` runs them.
"""

from __future__ import annotations

import importlib.util

#: The package each peer scenario needs (the ``bench`` extra installs them).
PACKAGES = {
    "pgqueuer-inprocess": "pgqueuer",
    "pgqueuer-latency": "pgqueuer",
    "procrastinate-latency": "procrastinate",
    "procrastinate-lanes": "procrastinate",
    "pgqueuer-idle": "pgqueuer",
    "procrastinate-idle": "procrastinate",
    "pgqueuer-horizon": "pgqueuer",
}


def missing(scenario: str) -> str | None:
    """Why the peer scenario cannot run here, or None when its package is installed."""
    package = PACKAGES.get(scenario)
    if package is None or importlib.util.find_spec(package) is not None:
        return None
    return f"{scenario} needs {package}: pip install -e '.[bench]'"
