"""``IssueCommentAdapter``: the adapter of the built-in ``ISSUE_COMMENT`` kind (GitHub's REST
API), the model of a read-back adapter.

Every comment ends with a hidden marker, ``<!-- outbox:<digest of the idempotency key> -->``
(a digest, so nothing of the key shows and no key can close the HTML comment early). One
attempt:

1. when ``attempt.write_started`` (an earlier attempt passed its fence and may have posted):
   list the issue's comments, every page of 100, and when one carries the marker return
   ``Done(<its id>)`` without posting again;
2. pass the fence, then ``POST /repos/{owner}/{repo}/issues/{n}/comments`` once.

==============================================  ==============================================
answer                                          result
==============================================  ==============================================
201 (or a comment found by the read-back)       ``Done("<comment id>")``
403/429 with ``Retry-After``, or                ``Defer`` that long (capped): a rate limit,
``x-ratelimit-remaining: 0``                    nothing written
5xx, timeout, connection refused or reset       ``Retry``; the next attempt reads back first
(before or after the fence)
other 4xx to the post                           ``Failed(GITHUB_HTTP_<code>)``
404/410 to the read-back                        ``Cancelled(GITHUB_ISSUE_GONE)``
the read-back cannot answer (401/403, too many  ``Uncertain(GITHUB_READBACK_...)``: a comment
pages, a failing last attempt)                  may exist and nobody can tell
==============================================  ==============================================

Logs name the action and the comment id; never the token, the body or the reply.
"""

from __future__ import annotations

import hashlib
import logging
import time
from datetime import timedelta
from typing import Any

import httpx

from outbox.attempt import ActionAttempt
from outbox.issue_comment.settings import IssueCommentSettings
from outbox.results import Abandoned, Cancelled, Defer, Done, Failed, Result, Retry, Uncertain
from outbox.retry_after import capped, parse_retry_after

log = logging.getLogger("outbox.issue_comment")

PER_PAGE = 100


def marker_of(idempotency_key: str) -> str:
    digest = hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:32]
    return f"<!-- outbox:{digest} -->"


def rate_limited(response: httpx.Response, cap: timedelta) -> Defer | None:
    """A ``Defer`` when the answer is a rate limit (GitHub's primary or secondary one)."""
    headers = response.headers
    status = response.status_code
    wait = parse_retry_after(headers.get("retry-after"))
    if status in (403, 429) and wait is not None:
        return Defer(capped(wait, cap), f"GITHUB_RATE_LIMITED_{status}")
    if status >= 400 and headers.get("x-ratelimit-remaining") == "0":
        reset = headers.get("x-ratelimit-reset", "")
        seconds = int(reset) - time.time() if reset.isdigit() else 60.0
        return Defer(capped(timedelta(seconds=seconds), cap), f"GITHUB_RATE_LIMITED_{status}")
    if status == 429:
        return Defer(capped(timedelta(seconds=60), cap), "GITHUB_RATE_LIMITED_429")
    return None


def _next_link(response: httpx.Response) -> str | None:
    link = response.links.get("next")
    return link.get("url") if link else None


class _ReadBack(Exception):
    def __init__(self, result: Result) -> None:
        self.result = result


class IssueCommentAdapter:
    """Posts ``ISSUE_COMMENT`` actions as comments. ``IssueCommentAdapter(IssueCommentSettings
    .from_env())`` and ``outbox.register(ISSUE_COMMENT, adapter)``; the payload is what
    ``enqueue_issue_comment`` records."""

    def __init__(self, settings: IssueCommentSettings | None = None) -> None:
        self.settings = settings or IssueCommentSettings.from_env()

    def __repr__(self) -> str:
        return f"IssueCommentAdapter({self.settings.api_url})"

    def _client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(
            base_url=self.settings.api_url,
            headers={
                "authorization": f"Bearer {self.settings.token}",
                "accept": "application/vnd.github+json",
                "x-github-api-version": "2022-11-28",
                "user-agent": "outbox",
            },
            timeout=self.settings.timeout.total_seconds(),
            follow_redirects=False,
            trust_env=False,
        )

    async def execute(self, attempt: ActionAttempt) -> Result:
        payload = attempt.payload
        if not (
            isinstance(payload, dict)
            and isinstance(payload.get("owner"), str)
            and isinstance(payload.get("repo"), str)
            and isinstance(payload.get("issue"), int)
            and isinstance(payload.get("body"), str)
        ):
            return Failed("ISSUE_COMMENT_BAD_PAYLOAD")
        path = f"/repos/{payload['owner']}/{payload['repo']}/issues/{payload['issue']}/comments"
        marker = marker_of(attempt.idempotency_key)
        async with self._client() as client:
            if attempt.write_started:
                try:
                    found = await self._find(client, path, marker)
                except _ReadBack as failed:
                    return self._readback_failed(attempt, failed.result)
                if found is not None:
                    log.info("issue comment action %s found by read-back: %s", attempt.id, found)
                    return Done(found)
            if not await attempt.fence().begin_write():
                return Abandoned()
            result = await self._post(client, path, f"{payload['body']}\n\n{marker}")
        log.log(
            logging.INFO if isinstance(result, Done) else logging.WARNING,
            "issue comment action %s attempt %s: %s %s",
            attempt.id,
            attempt.attempt,
            type(result).__name__.lower(),
            getattr(result, "reason", None) or getattr(result, "ref", ""),
        )
        return result

    @staticmethod
    def _readback_failed(attempt: ActionAttempt, result: Result) -> Result:
        # A Retry leaves the evidence (earlier_write_at) for the next attempt to read back; on
        # the last attempt nothing is left to read back with: a comment may exist.
        if isinstance(result, Retry) and attempt.attempt >= attempt.max_attempts:
            return Uncertain(result.reason or "GITHUB_READBACK_FAILED")
        return result

    async def _get(
        self, client: httpx.AsyncClient, url: str, params: dict | None
    ) -> httpx.Response:
        try:
            response = await client.get(url, params=params)
        except httpx.TimeoutException:
            raise _ReadBack(Retry(reason="GITHUB_READBACK_TIMEOUT")) from None
        except httpx.TransportError:
            raise _ReadBack(Retry(reason="GITHUB_READBACK_CONNECTION_FAILED")) from None
        limited = rate_limited(response, self.settings.max_retry_after)
        if limited is not None:
            raise _ReadBack(limited)
        status = response.status_code
        if status in (404, 410):
            raise _ReadBack(Cancelled("GITHUB_ISSUE_GONE"))
        if status >= 500:
            raise _ReadBack(Retry(reason=f"GITHUB_READBACK_HTTP_{status}"))
        if status != 200:
            raise _ReadBack(Uncertain(f"GITHUB_READBACK_HTTP_{status}"))
        return response

    async def _find(self, client: httpx.AsyncClient, path: str, marker: str) -> str | None:
        """The id of the issue's comment that carries ``marker``, reading every page."""
        url: str = path
        params: dict[str, Any] | None = {"per_page": PER_PAGE}
        for _ in range(self.settings.max_readback_pages):
            response = await self._get(client, url, params)
            try:
                comments = response.json()
            except ValueError:
                raise _ReadBack(Retry(reason="GITHUB_READBACK_BAD_JSON")) from None
            for comment in comments if isinstance(comments, list) else []:
                if isinstance(comment, dict) and marker in str(comment.get("body") or ""):
                    return str(comment.get("id"))
            following = _next_link(response)
            if following is None:
                return None
            # Only ever to the same API: the token goes with the request.
            if not following.startswith(self.settings.api_url + "/"):
                raise _ReadBack(Uncertain("GITHUB_READBACK_FOREIGN_NEXT_PAGE"))
            url, params = following, None
        raise _ReadBack(Uncertain("GITHUB_READBACK_TOO_MANY_PAGES"))

    async def _post(self, client: httpx.AsyncClient, path: str, body: str) -> Result:
        try:
            response = await client.post(path, json={"body": body})
        except httpx.TimeoutException:
            return Retry(reason="GITHUB_TIMEOUT")
        except httpx.TransportError:
            return Retry(reason="GITHUB_CONNECTION_FAILED")
        status = response.status_code
        if status in (200, 201):
            try:
                return Done(str(response.json()["id"]))
            except (ValueError, KeyError, TypeError):
                return Retry(reason="GITHUB_BAD_REPLY")  # the next attempt reads back
        limited = rate_limited(response, self.settings.max_retry_after)
        if limited is not None:
            return limited
        if status >= 500:
            return Retry(reason=f"GITHUB_HTTP_{status}")
        return Failed(f"GITHUB_HTTP_{status}")
