"""``WebhookSettings``: how the ``WEBHOOK`` adapter delivers, from ``OUTBOX_WEBHOOK_*``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from outbox.errors import ConfigurationError
from outbox.webhook.address_guard import AddressPolicy

ENV = "OUTBOX_WEBHOOK_"


@dataclass(frozen=True, slots=True)
class WebhookSettings:
    #: Which non-public addresses an endpoint may have (``OUTBOX_WEBHOOK_ALLOW_PRIVATE``).
    address_policy: AddressPolicy = field(default_factory=AddressPolicy)
    #: The whole request, connect to last byte. Keep it below the outbox's write margin.
    timeout: timedelta = timedelta(seconds=10)
    #: Deliveries in a row an endpoint does not accept before its subscription is disabled.
    disable_after_failures: int = 20
    #: The longest a ``Retry-After`` may make a delivery wait.
    max_retry_after: timedelta = timedelta(hours=1)
    #: The wait of a 429 without ``Retry-After``.
    rate_limit_wait: timedelta = timedelta(seconds=60)
    #: How long a delivery to a disabled endpoint waits before it looks again (no attempt spent).
    disabled_recheck: timedelta = timedelta(minutes=5)

    def __post_init__(self) -> None:
        if self.disable_after_failures < 1:
            raise ConfigurationError(f"{ENV}DISABLE_AFTER_FAILURES: must be >= 1")
        for name in ("timeout", "max_retry_after", "rate_limit_wait", "disabled_recheck"):
            if getattr(self, name) <= timedelta(0):
                raise ConfigurationError(f"{ENV}{name.upper()}_SECONDS: must be more than 0")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> WebhookSettings:
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        raw = env.get(f"{ENV}ALLOW_PRIVATE")
        try:
            values["address_policy"] = AddressPolicy.parse(raw)
        except ValueError as error:
            raise ConfigurationError(f"{ENV}ALLOW_PRIVATE: {error}") from None
        for name in ("timeout", "max_retry_after", "rate_limit_wait", "disabled_recheck"):
            variable = f"{ENV}{name.upper()}_SECONDS"
            if variable in env:
                values[name] = timedelta(seconds=_number(variable, env[variable], float))
        variable = f"{ENV}DISABLE_AFTER_FAILURES"
        if variable in env:
            values["disable_after_failures"] = int(_number(variable, env[variable], int))
        return cls(**values)  # type: ignore[arg-type]


def _number(variable: str, raw: str, convert: type[int] | type[float]) -> float:
    try:
        value = convert(raw)
    except ValueError:
        raise ConfigurationError(f"{variable}: {raw!r} is not a number") from None
    if not 0 <= value < float("inf"):
        raise ConfigurationError(f"{variable}: {raw!r} must be a finite number >= 0")
    return value
