"""The application the soak's claimer and worker processes load:
``benchmarks.chaos.app:make_outbox``.

Two kinds:

- the built-in ``EMAIL`` (at-most-once) through the real ``EmailAdapter`` to the soak's SMTP sink
  (``OUTBOX_SMTP_URL``), wrapped only to record each attempt and to pause after the fence when
  the event asks for it (``linger``);
- ``CHAOS_COMMENT`` (read-back) through ``CommentAdapter`` to the comment store.

The world and watch schemas come from ``CHAOS_WORLD_SCHEMA`` and ``CHAOS_WATCH_SCHEMA``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from typing import Any

from benchmarks.chaos.comments import COMMENT, CommentAdapter, CommentStore
from benchmarks.chaos.recording import Recorder, run_recorded
from outbox import EMAIL, ActionAttempt, Outbox, Result
from outbox.email import EmailAdapter, EmailNotice, PreparedEmail, SmtpSettings

#: The sender of every soak email (its domain is in every Message-ID).
SENDER = "Chaos Soak <soak@chaos.example.com>"


def recipient(n: int, fault: str) -> str:
    """The address of email ``n``. ``fault`` tells the sink what to do with it: ``rK`` refuses
    RCPT with a 4xx K times, ``dK`` refuses after DATA with a 4xx K times, ``s`` accepts and
    answers late; empty: accept at once."""
    return f"c{n}+{fault}@people.example.org" if fault else f"c{n}@people.example.org"


class ChaosNotice(EmailNotice):
    """Email ``n`` of the soak, to its own address; renders from the event alone."""

    name = "chaos"
    expires_after = None
    max_attempts = 20

    def prepare(self, event: Mapping[str, Any]) -> PreparedEmail:
        n = event["n"]
        return PreparedEmail(
            to=recipient(n, event.get("fault", "")),
            subject=f"Chaos {n}",
            text=f"Email {n} of the chaos soak.\n",
        )

    async def prepare_async(self, event: Mapping[str, Any]) -> PreparedEmail:
        return self.prepare(event)


class RecordedEmailAdapter(EmailAdapter):
    """The real ``EmailAdapter``, its attempts recorded (see ``recording``)."""

    def __init__(self, smtp: SmtpSettings, recorder: Recorder) -> None:
        super().__init__(smtp, [ChaosNotice()])
        self.recorder = recorder

    async def execute(self, attempt: ActionAttempt) -> Result:
        payload = attempt.payload if isinstance(attempt.payload, dict) else {}
        linger = float((payload.get("event") or {}).get("linger", 0))
        return await run_recorded(self.recorder, attempt, linger, super().execute)


def build(database_url: str, schema: str, world: str, watch: str) -> Outbox:
    outbox = Outbox(database_url, schema=schema)
    recorder = Recorder(database_url, watch)
    outbox.register(EMAIL, RecordedEmailAdapter(SmtpSettings.from_env(), recorder))
    outbox.register(COMMENT, CommentAdapter(CommentStore(database_url, world), recorder))
    return outbox


@cache
def make_outbox() -> Outbox:
    """The soak's ``Outbox`` from the environment the harness gives its processes."""
    return build(
        os.environ["OUTBOX_DATABASE_URL"],
        os.environ["OUTBOX_SCHEMA"],
        os.environ["CHAOS_WORLD_SCHEMA"],
        os.environ["CHAOS_WATCH_SCHEMA"],
    )
