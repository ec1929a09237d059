"""The application the Dramatiq email test runs in real claimer and worker processes.

It sends the built-in EMAIL kind through ``EmailAdapter`` to the relay named by
``OUTBOX_SMTP_URL`` (the test's aiosmtpd sink), from ``OUTBOX_SMTP_SENDER``.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from typing import Any

from outbox import EMAIL, Outbox
from outbox.email import EmailAdapter, EmailNotice, PreparedEmail, SmtpSettings


class NumberedNotice(EmailNotice):
    """Email number ``n`` to its own address; renders from the event alone (no I/O)."""

    name = "numbered"

    def prepare(self, event: Mapping[str, Any]) -> PreparedEmail:
        n = event["n"]
        return PreparedEmail(
            to=f"user{n}@people.example.org", subject=f"Message {n}", text=f"Number {n}.\n"
        )

    async def prepare_async(self, event: Mapping[str, Any]) -> PreparedEmail:
        return self.prepare(event)  # nothing blocks: no worker thread needed


@cache
def make_outbox() -> Outbox:
    """``tests.apps.email_app:make_outbox``: database, schema and broker from ``OUTBOX_*``."""
    outbox = Outbox()
    outbox.register(EMAIL, EmailAdapter(SmtpSettings.from_env(), [NumberedNotice()]))
    return outbox
