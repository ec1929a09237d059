"""``ChatReplySettings``: the chat service's Web API (Slack's shape), from the environment."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from outbox.errors import ConfigurationError

DEFAULT_API_URL = "https://slack.com/api"


@dataclass(frozen=True, slots=True)
class ChatReplySettings:
    #: A bot token that may post in the channels (``OUTBOX_SLACK_TOKEN``).
    token: str = field(repr=False, default="")
    #: The Web API's base URL (``OUTBOX_SLACK_API_URL``).
    api_url: str = DEFAULT_API_URL
    #: Each request, connect to last byte (``OUTBOX_SLACK_TIMEOUT_SECONDS``); below the margin.
    timeout: timedelta = timedelta(seconds=10)
    #: The longest a rate limit may make a message wait.
    max_retry_after: timedelta = timedelta(hours=1)
    #: The wait of a rate limit that names none.
    rate_limit_wait: timedelta = timedelta(seconds=60)
    #: Pages the read-back reads at most before it gives up (Uncertain).
    max_readback_pages: int = 20

    def __post_init__(self) -> None:
        if not self.api_url.startswith(("http://", "https://")):
            raise ConfigurationError("OUTBOX_SLACK_API_URL: must start with http:// or https://")
        if self.timeout <= timedelta(0):
            raise ConfigurationError("OUTBOX_SLACK_TIMEOUT_SECONDS: must be more than 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ChatReplySettings:
        env = os.environ if environ is None else environ
        token = env.get("OUTBOX_SLACK_TOKEN", "")
        if not token:
            raise ConfigurationError("OUTBOX_SLACK_TOKEN: not set (a bot token that may post)")
        raw = env.get("OUTBOX_SLACK_TIMEOUT_SECONDS")
        try:
            timeout = timedelta(seconds=float(raw)) if raw is not None else timedelta(seconds=10)
        except ValueError:
            raise ConfigurationError(
                f"OUTBOX_SLACK_TIMEOUT_SECONDS: {raw!r} is not a number of seconds"
            ) from None
        return cls(
            token=token,
            api_url=env.get("OUTBOX_SLACK_API_URL", DEFAULT_API_URL).rstrip("/"),
            timeout=timeout,
        )
