"""The application the Dramatiq read-back tests run in real claimer and worker processes: the
built-in ISSUE_COMMENT and CHAT_REPLY kinds, configured from ``OUTBOX_GITHUB_*`` and
``OUTBOX_SLACK_*`` (a kind whose settings are absent is not registered)."""

from __future__ import annotations

import os
from functools import cache

from outbox import Outbox
from outbox.chat_reply import CHAT_REPLY, ChatReplyAdapter
from outbox.issue_comment import ISSUE_COMMENT, IssueCommentAdapter


@cache
def make_outbox() -> Outbox:
    """``tests.apps.readback_app:make_outbox``: database, schema and broker from ``OUTBOX_*``."""
    outbox = Outbox()
    if os.environ.get("OUTBOX_GITHUB_TOKEN"):
        outbox.register(ISSUE_COMMENT, IssueCommentAdapter())
    if os.environ.get("OUTBOX_SLACK_TOKEN"):
        outbox.register(CHAT_REPLY, ChatReplyAdapter())
    return outbox
