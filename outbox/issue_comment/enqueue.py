"""``enqueue_issue_comment``: one comment on an issue, in the caller's transaction."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

from outbox.action import Action
from outbox.enqueuing import enqueue
from outbox.errors import InvalidActionRequest
from outbox.kinds import ISSUE_COMMENT
from outbox.request import ActionRequest

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,100}")


def issue_comment_request(
    owner: str,
    repo: str,
    issue: int,
    body: str,
    *,
    idempotency_key: str,
    workspace_id: str | int,
    max_attempts: int = 8,
    expires_at: datetime | None = None,
) -> ActionRequest:
    for name, value in (("owner", owner), ("repo", repo)):
        if not isinstance(value, str) or not _NAME.fullmatch(value):
            raise InvalidActionRequest(name, "must be 1 to 100 of letters, digits, '.', '_', '-'")
    if not isinstance(issue, int) or isinstance(issue, bool) or issue < 1:
        raise InvalidActionRequest("issue", "must be an issue number (1 or more)")
    if not isinstance(body, str) or not body.strip():
        raise InvalidActionRequest("body", "must be non-empty text")
    return ActionRequest(
        kind=ISSUE_COMMENT,
        # One issue's comments are posted one at a time, in the order they were enqueued.
        lane_key=f"issue:{owner}/{repo}#{issue}",
        idempotency_key=idempotency_key,
        payload={"owner": owner, "repo": repo, "issue": issue, "body": body},
        workspace_id=workspace_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )


def enqueue_issue_comment(
    conn: Any,
    owner: str,
    repo: str,
    issue: int,
    body: str,
    *,
    idempotency_key: str,
    workspace_id: str | int,
    max_attempts: int = 8,
    expires_at: datetime | None = None,
    schema: str | None = None,
) -> Action:
    """Enqueues a comment ``body`` on ``owner/repo#issue`` on ``conn`` (commits nothing).

    The body travels in the payload (at most ``OUTBOX_MAX_PAYLOAD_BYTES``). Raises
    ``InvalidActionRequest`` naming the field; a second call with the key returns the first.
    """
    request = issue_comment_request(
        owner,
        repo,
        issue,
        body,
        idempotency_key=idempotency_key,
        workspace_id=workspace_id,
        max_attempts=max_attempts,
        expires_at=expires_at,
    )
    return enqueue(conn, request, schema=schema)
