"""``IssueCommentSettings``: the issue tracker's API (GitHub's REST shape), from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from outbox.errors import ConfigurationError

DEFAULT_API_URL = "https://api.github.com"


@dataclass(frozen=True, slots=True)
class IssueCommentSettings:
    #: A token that may comment on the issues (``OUTBOX_GITHUB_TOKEN``).
    token: str = field(repr=False, default="")
    #: The REST API's base URL (``OUTBOX_GITHUB_API_URL``; GitHub Enterprise: ``https://host/api/v3``).
    api_url: str = DEFAULT_API_URL
    #: Each request, connect to last byte (``OUTBOX_GITHUB_TIMEOUT_SECONDS``); below the margin.
    timeout: timedelta = timedelta(seconds=10)
    #: The longest a rate limit may make a comment wait.
    max_retry_after: timedelta = timedelta(hours=1)
    #: Pages of 100 comments the read-back reads at most before it gives up (Uncertain).
    max_readback_pages: int = 50

    def __post_init__(self) -> None:
        if not self.api_url.startswith(("http://", "https://")):
            raise ConfigurationError("OUTBOX_GITHUB_API_URL: must start with http:// or https://")
        if self.timeout <= timedelta(0):
            raise ConfigurationError("OUTBOX_GITHUB_TIMEOUT_SECONDS: must be more than 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> IssueCommentSettings:
        env = os.environ if environ is None else environ
        token = env.get("OUTBOX_GITHUB_TOKEN", "")
        if not token:
            raise ConfigurationError("OUTBOX_GITHUB_TOKEN: not set (a token that may comment)")
        raw = env.get("OUTBOX_GITHUB_TIMEOUT_SECONDS")
        try:
            timeout = timedelta(seconds=float(raw)) if raw is not None else timedelta(seconds=10)
        except ValueError:
            raise ConfigurationError(
                f"OUTBOX_GITHUB_TIMEOUT_SECONDS: {raw!r} is not a number of seconds"
            ) from None
        return cls(
            token=token,
            api_url=env.get("OUTBOX_GITHUB_API_URL", DEFAULT_API_URL).rstrip("/"),
            timeout=timeout,
        )
