"""The application the metrics scrape test runs in a real claimer and worker.

One kind, ``MX_<suffix>`` (from ``METRICS_APP_SUFFIX``, so its Dramatiq queue is the test's own),
whose adapter returns what the payload's ``plan`` says, attempt by attempt: ``done``, ``failed``,
``uncertain``, ``cancelled`` or ``retry``. It passes its fence before every result but ``retry``.
"""

from __future__ import annotations

import os
from datetime import timedelta
from functools import cache

from outbox import (
    Abandoned,
    ActionAttempt,
    ActionKind,
    Cancelled,
    Done,
    Failed,
    Outbox,
    Result,
    Retry,
    Uncertain,
)


def kind(suffix: str) -> ActionKind:
    return ActionKind(f"MX_{suffix}")


class PlannedAdapter:
    async def execute(self, attempt: ActionAttempt) -> Result:
        step = attempt.payload["plan"][attempt.attempt - 1]
        if step == "retry":
            return Retry(after=timedelta(milliseconds=100))
        if not await attempt.fence().begin_write():
            return Abandoned()
        results = {
            "done": Done(f"ref-{attempt.id}"),
            "failed": Failed("REJECTED"),
            "uncertain": Uncertain("TIMEOUT"),
            "cancelled": Cancelled("UNSUBSCRIBED"),
        }
        return results[step]


def build(database_url: str, schema: str, suffix: str) -> Outbox:
    outbox = Outbox(database_url, schema=schema)
    outbox.register(kind(suffix), PlannedAdapter())
    return outbox


@cache
def make_outbox() -> Outbox:
    """``tests.apps.metrics_app:make_outbox``: the app from the environment."""
    return build(
        os.environ["OUTBOX_DATABASE_URL"],
        os.environ["OUTBOX_SCHEMA"],
        os.environ["METRICS_APP_SUFFIX"],
    )
