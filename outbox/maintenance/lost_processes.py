"""What the give-backs of a lost process's work share (``lost_claimers``, ``lost_workers``):
when a silence says lost, the counter, and one WARNING a process whose work was given back.

A process is lost when its heartbeat has been silent for ``silent`` (``LIVE_INTERVALS``
heartbeat intervals) while the claimer that judges could reach the database all along. A
database restart, a failover or a cut network silences every process at once, the live ones
too, and giving back their work would cost each of their unfenced attempts an attempt. So a
claimer judges only while its own beats have run unbroken for ``silent``
(``outbox_claimer_may_judge``, on the database's clock as the give-back runs); by then each live
process has beaten again.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence
from datetime import timedelta

from outbox import metrics
from outbox.durations import say_duration

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
            "%s %s has been silent for over %s; gave back %s of its %s (kinds %s; due again now)",
            role,
            process,
            _say_silence(silent),
            released,
            what,
            ", ".join(kinds),
            extra={"event": reason, role: process, "released": released},
        )


def _say_silence(silent: timedelta) -> str:
    """``silent`` in the operator's words; a silence of a fraction of a second (sub-second
    heartbeats, as fault drills run them) to a tenth of a second rather than rounded to 0s."""
    seconds = silent.total_seconds()
    return say_duration(seconds) if seconds >= 10 or seconds.is_integer() else f"{seconds:.1f}s"
