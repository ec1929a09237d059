"""``outbox prune`` and ``outbox erase``: the two commands that delete actions.

Each counts what it would delete first (by kind and state; ``--dry-run`` prints that and stops)
and asks before deleting more than ``Settings.confirm_threshold`` actions, or, for a prune,
with a retention shorter than the configured one (saying how many UNCERTAIN actions it would
take: once deleted, nobody can look them up to resolve them). On a terminal it asks; elsewhere
it refuses in one line unless ``--yes`` was given. What it did is said in plain words.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TextIO

import psycopg

from outbox._io import run_sync
from outbox.errors import ConfigurationError, OutboxError
from outbox.previews import DeletionPreview, erase_preview_operation, prune_preview_operation

#: Answers that confirm; anything else (an empty line, end of input) declines.
YES = frozenset({"y", "yes"})


class ConfirmationNeeded(ConfigurationError):
    """A deletion that needs a confirmation was not confirmed, and no terminal could ask."""


class NotConfirmed(OutboxError):
    """The operator declined at the prompt; nothing was deleted."""


@dataclass(frozen=True, slots=True)
class Consent:
    """How the operator consents: ``--yes``, or an answer on the terminal ``stdin`` is."""

    yes: bool
    stdin: TextIO
    stderr: TextIO

    @classmethod
    def from_args(cls, args: Any) -> Consent:
        return cls(bool(args.yes), sys.stdin, sys.stderr)

    def ask(self, verb: str, preview: DeletionPreview, reasons: list[str]) -> None:
        """Returns when the deletion may go on; raises when it may not."""
        if not reasons or self.yes:
            return
        why = "; ".join(reasons)
        if not self.stdin.isatty():
            raise ConfirmationNeeded(
                f"{why}: pass --yes to {verb} them (--dry-run lists them by kind and state)"
            )
        self.stderr.write(f"{verb} would delete:\n{preview.render()}\n{why}.\n")
        self.stderr.write(f"{verb.capitalize()} these {preview.total:,} actions? [y/N] ")
        self.stderr.flush()
        answer = self.stdin.readline().strip().lower()
        if answer not in YES:
            raise NotConfirmed("nothing deleted (not confirmed)")


def duration_in_words(duration: timedelta) -> str:
    """``30 days``, ``1 day``, ``12 hours``, ``90 minutes``, ``45 seconds``, ``1.5 seconds``."""
    seconds = duration.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}{'' if count == 1 else 's'}"
    return f"{seconds:g} second{'' if seconds == 1 else 's'}"


def _ended_phrase(retention: timedelta, now: bool = False) -> str:
    """What the prune takes, after "actions that": ``ended more than 30 days ago``."""
    if retention <= timedelta(0):
        return f"{'have' if now else 'had'} ended (retention 0: every ended action)"
    return f"ended more than {duration_in_words(retention)} ago"


def _plural(n: int, noun: str = "action") -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def prune_reasons(
    preview: DeletionPreview, retention: timedelta, configured: timedelta, threshold: int
) -> list[str]:
    """Why this prune needs a confirmation (none: it may go on)."""
    reasons = []
    if preview.total > threshold:
        reasons.append(
            f"it would delete {_plural(preview.total)}, more than the confirmation threshold "
            f"({threshold:,}, OUTBOX_CONFIRM_THRESHOLD)"
        )
    if retention < configured and preview.total:
        reasons.append(
            f"the retention ({duration_in_words(retention)}) is shorter than the configured "
            f"{duration_in_words(configured)}, and it would delete {preview.uncertain:,} "
            "unresolved UNCERTAIN actions"
        )
    return reasons


def prune_command(
    conn: psycopg.Connection[Any],
    *,
    schema: str,
    retention: timedelta,
    configured: timedelta,
    threshold: int,
    dry_run: bool,
    consent: Consent,
    prune: Callable[[], int],
    as_json: bool,
    emit: Callable[[Any], None],
) -> int:
    preview = run_sync(conn, prune_preview_operation(schema, retention))
    conn.rollback()  # the preview's snapshot is not held while the operator thinks
    what = _ended_phrase(retention)
    if dry_run:
        if as_json:
            emit(
                {
                    "dry_run": True,
                    "would_prune": preview.total,
                    "retention_seconds": retention.total_seconds(),
                    "by_kind_and_state": preview.as_rows(),
                }
            )
        else:
            print(
                f"dry run: would prune {_plural(preview.total)} that "
                f"{_ended_phrase(retention, now=True)}; nothing deleted"
            )
            if preview.total:
                print(preview.render())
        return 0
    consent.ask("prune", preview, prune_reasons(preview, retention, configured, threshold))
    pruned = prune()
    if as_json:
        emit({"pruned": pruned, "retention_seconds": retention.total_seconds()})
    elif pruned:
        print(f"pruned {_plural(pruned)} that {what}")
    else:
        print(f"pruned nothing: no action {what}")
    return 0


def erase_command(
    conn: psycopg.Connection[Any],
    *,
    schema: str,
    account: str,
    threshold: int,
    dry_run: bool,
    consent: Consent,
    erase: Callable[[], Any],
    as_json: bool,
    emit: Callable[[Any], None],
) -> int:
    preview = run_sync(conn, erase_preview_operation(schema, account))
    conn.rollback()
    if dry_run:
        if as_json:
            emit(
                {
                    "dry_run": True,
                    "would_erase": preview.total,
                    "by_kind_and_state": preview.as_rows(),
                }
            )
        else:
            print(
                f"dry run: would erase {_plural(preview.total)} whose subject is the account; "
                "nothing deleted"
            )
            if preview.total:
                print(preview.render())
        return 0
    reasons = []
    if preview.total > threshold:
        reasons.append(
            f"it would erase {_plural(preview.total)}, more than the confirmation threshold "
            f"({threshold:,}, OUTBOX_CONFIRM_THRESHOLD)"
        )
    consent.ask("erase", preview, reasons)
    report = erase()
    if as_json:
        emit({"erased": report.erased, "by_state": report.by_state})
        return 0
    states = ", ".join(f"{n:,} {s}" for s, n in report.by_state.items())
    if report.erased:
        print(f"erased {_plural(report.erased)} whose subject is the account ({states})")
    else:
        print("erased nothing: no action has the account as its subject")
    if report.in_flight:
        print(
            f"{_plural(report.in_flight)} {'was' if report.in_flight == 1 else 'were'} executing: "
            "a provider call past its fence may still happen; its result will not be recorded"
        )
    return 0
