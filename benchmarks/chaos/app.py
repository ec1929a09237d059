"""The application the soak's claimer and worker processes load:
``benchmarks.chaos.app:make_outbox``.

The built-in kinds, each through its real adapter, wrapped only to record each attempt and to
pause where the action asks for it (``linger`` after the fence, ``linger_after`` after the
adapter returned):

- ``EMAIL`` (at-most-once) to the soak's SMTP sink (``OUTBOX_SMTP_URL``);
- ``WEBHOOK``, ``ISSUE_COMMENT`` and ``CHAT_REPLY`` (read-back) to the soak's HTTP providers
  (``benchmarks.chaos.receivers``), configured by their own ``OUTBOX_*`` settings.

The watch schema (where attempts are recorded) comes from ``CHAOS_WATCH_SCHEMA``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from functools import cache
from typing import Any

from benchmarks.chaos.recording import Recorder, run_recorded
from outbox import EMAIL, ActionAdapter, ActionAttempt, Outbox, Result
from outbox.chat_reply import CHAT_REPLY, ChatReplyAdapter
from outbox.email import EmailAdapter, EmailNotice, PreparedEmail, SmtpSettings
from outbox.issue_comment import ISSUE_COMMENT, IssueCommentAdapter
from outbox.webhook import WEBHOOK, WebhookAdapter

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


def knobs(payload: Any) -> Mapping[str, Any]:
    """The soak's pauses for one action: ``payload["chaos"]`` (issue comments, chat replies) or
    the webhook's ``data["chaos"]``; the adapters ignore both."""
    if not isinstance(payload, dict):
        return {}
    data = payload.get("data")
    found = payload.get("chaos") or (data.get("chaos") if isinstance(data, dict) else None)
    return found if isinstance(found, dict) else {}


class RecordedAdapter:
    """A built-in read-back adapter, its attempts recorded (see ``recording``)."""

    def __init__(self, inner: ActionAdapter, recorder: Recorder) -> None:
        self.inner = inner
        self.recorder = recorder

    async def execute(self, attempt: ActionAttempt) -> Result:
        chaos = knobs(attempt.payload)
        return await run_recorded(
            self.recorder,
            attempt,
            float(chaos.get("linger", 0)),
            self.inner.execute,
            float(chaos.get("linger_after", 0)),
        )


#: The soak's kinds' queues (a Celery worker is given them by name).
QUEUES = [kind.queue_name for kind in (EMAIL, WEBHOOK, ISSUE_COMMENT, CHAT_REPLY)]


def build(database_url: str, schema: str, watch: str) -> Outbox:
    outbox = Outbox(database_url, schema=schema)
    recorder = Recorder(database_url, watch)
    outbox.register(EMAIL, RecordedEmailAdapter(SmtpSettings.from_env(), recorder))
    webhooks = WebhookAdapter(database_url, schema=schema)
    outbox.register(WEBHOOK, RecordedAdapter(webhooks, recorder))
    outbox.register(ISSUE_COMMENT, RecordedAdapter(IssueCommentAdapter(), recorder))
    outbox.register(CHAT_REPLY, RecordedAdapter(ChatReplyAdapter(), recorder))
    return outbox


@cache
def make_outbox() -> Outbox:
    """The soak's ``Outbox`` from the environment the harness gives its processes."""
    return build(
        os.environ["OUTBOX_DATABASE_URL"],
        os.environ["OUTBOX_SCHEMA"],
        os.environ["CHAOS_WATCH_SCHEMA"],
    )
