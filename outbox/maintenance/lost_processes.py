"""What the give-backs of a lost process's work share (``lost_claimers``, ``lost_workers``):
the counter, and one WARNING a process whose work was given back."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta

from outbox import metrics

log = logging.getLogger("outbox.claimer")


def report_given_back(
    reason: str, role: str, given_back: Sequence[tuple[str, str]], silent: timedelta, what: str
) -> None:
    """Counts ``given_back`` (the process id and kind of each claim or attempt given back) under
    ``reason``, which is also the log lines' event, and logs a line for each process (``role``:
    claimer or worker) saying how many of its ``what`` went back, and of which kinds."""
    metrics.record_given_back(reason, len(given_back))
    for process, released in sorted(Counter(process for process, _ in given_back).items()):
        kinds = sorted({kind for p, kind in given_back if p == process})
        log.warning(
            "%s %s has been silent for over %ss; gave back %s of its %s (kinds %s; due again now)",
            role,
            process,
            int(silent.total_seconds()),
            released,
            what,
            ", ".join(kinds),
            extra={"event": reason, role: process, "released": released},
        )
