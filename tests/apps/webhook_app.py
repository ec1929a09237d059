"""The application the Dramatiq webhook test runs in real claimer and worker processes: the
built-in WEBHOOK kind through ``WebhookAdapter``, with ``OUTBOX_WEBHOOK_*`` from the test."""

from __future__ import annotations

from functools import cache

from outbox import Outbox
from outbox.webhook import WEBHOOK, WebhookAdapter


@cache
def make_outbox() -> Outbox:
    """``tests.apps.webhook_app:make_outbox``: database, schema and broker from ``OUTBOX_*``."""
    outbox = Outbox()
    adapter = WebhookAdapter(outbox.settings.require_database_url(), schema=outbox.settings.schema)
    outbox.register(WEBHOOK, adapter)
    return outbox
