"""Erasure: every action whose subject is an account is deleted, in the caller's transaction.

Once the caller commits, a pending action of the account is never carried out (there is no row
left to claim), and an attempt that is running finds no row: its fence refuses (so the provider
is not called), or, if the fence had already passed, its provider call still happens and its late
finish changes nothing (counted as ``recorded="false"``). Nothing here commits.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from outbox._io import Operation, Statement
from outbox.connectors import run_async_on, run_sync_on
from outbox.enqueuing import default_schema
from outbox.errors import InvalidActionRequest
from outbox.queries import queries_for
from outbox.state import ActionState

log = logging.getLogger("outbox.erasure")


@dataclass(frozen=True, slots=True)
class ErasureReport:
    """What an erasure deleted: how many actions, and in which state each was."""

    erased: int
    by_state: dict[str, int] = field(default_factory=dict)

    @property
    def in_flight(self) -> int:
        """Actions that were EXECUTING: a provider call that already passed its fence may still
        reach the provider; its result is then not recorded."""
        return self.by_state.get(ActionState.EXECUTING.value, 0)


def erase_subject_operation(schema: str, account_id: str | int) -> Operation[ErasureReport]:
    if account_id is None or str(account_id) == "":
        raise InvalidActionRequest("account_id", "give the account whose actions to erase")
    rows = yield Statement(queries_for(schema)["erase_subject"], {"account_id": str(account_id)})
    by_state = Counter(row["state"] for row in rows)
    report = ErasureReport(len(rows), dict(sorted(by_state.items())))
    # The account id stays out of the log: the point of an erasure is to forget the subject.
    log.info(
        "erased %d actions of one subject",
        report.erased,
        extra={"event": "erased", "erased": report.erased, "by_state": report.by_state},
    )
    return report


def erase_subject(conn: Any, account_id: str | int, *, schema: str | None = None) -> ErasureReport:
    """Deletes every action whose ``subject_account_id`` is ``account_id``, in the caller's
    transaction (commits nothing). ``conn`` is any connection ``enqueue`` takes."""
    op = erase_subject_operation(schema or default_schema(), account_id)
    return run_sync_on(conn, op, "erase_subject", "erase_subject_async")


async def erase_subject_async(
    conn: Any, account_id: str | int, *, schema: str | None = None
) -> ErasureReport:
    """The async twin of ``erase_subject``."""
    op = erase_subject_operation(schema or default_schema(), account_id)
    return await run_async_on(conn, op, "erase_subject_async", "erase_subject")
