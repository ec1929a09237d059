"""``Retry-After`` as an HTTP server sends it (RFC 9110: seconds, or an HTTP date), for the
adapters that speak HTTP: a rate limit becomes a ``Defer`` for that long, capped."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime


def parse_retry_after(value: str | None, *, now: datetime | None = None) -> timedelta | None:
    """The wait a ``Retry-After`` header asks for, or None when it is absent or unreadable.
    A date in the past is no wait at all."""
    if value is None:
        return None
    text = value.strip()
    if text.isdigit():
        return timedelta(seconds=int(text))
    try:
        when = parsedate_to_datetime(text)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(when - (now or datetime.now(UTC)), timedelta(0))


def capped(wait: timedelta, cap: timedelta, floor: timedelta = timedelta(seconds=1)) -> timedelta:
    """``wait`` within [floor, cap]: a server cannot park an action for a year, nor make the
    outbox hammer it with a wait of zero."""
    return min(max(wait, floor), cap)
