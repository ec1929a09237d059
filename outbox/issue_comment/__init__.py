"""Issue comments: the built-in ``ISSUE_COMMENT`` kind (GitHub's REST API shape), read-back.

``enqueue_issue_comment`` records a comment in the caller's transaction;
``IssueCommentAdapter`` posts it with a hidden marker and, after an ambiguous failure, finds the
earlier comment by that marker instead of posting twice.
"""

from outbox.issue_comment.adapter import IssueCommentAdapter, marker_of
from outbox.issue_comment.enqueue import enqueue_issue_comment, issue_comment_request
from outbox.issue_comment.settings import IssueCommentSettings
from outbox.kinds import ISSUE_COMMENT

__all__ = [
    "ISSUE_COMMENT",
    "IssueCommentAdapter",
    "IssueCommentSettings",
    "enqueue_issue_comment",
    "issue_comment_request",
    "marker_of",
]
