"""The application the Dramatiq read-back tests run in real claimer and worker processes: the
built-in ISSUE_COMMENT kind, configured from ``OUTBOX_GITHUB_*``."""

from __future__ import annotations

from functools import cache

from outbox import Outbox
from outbox.issue_comment import ISSUE_COMMENT, IssueCommentAdapter


@cache
def make_outbox() -> Outbox:
    """``tests.apps.readback_app:make_outbox``: database, schema and broker from ``OUTBOX_*``."""
    outbox = Outbox()
    outbox.register(ISSUE_COMMENT, IssueCommentAdapter())
    return outbox
