"""``EmailNotice``: one class per kind of email, registered by name, preparing the message.

A notice turns an event (the JSON the action's payload holds) into a ``PreparedEmail``, or says
why the recipient cannot receive it (``CannotReceive``). It runs at enqueue time and again before
every attempt, so it must read the recipient's *current* state (subscribed, role, address) each
time: that is how a retry never reaches a person who opted out meanwhile.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from email.errors import HeaderParseError
from email.headerregistry import Address
from typing import Any, ClassVar

from outbox.errors import OutboxError

_NAME = re.compile(r"[a-z][a-z0-9_.-]{0,99}")
# Header values must not carry line breaks: one would let an event inject headers.
_LINE_BREAK = re.compile(r"[\r\n]")
# What a header value must not hold: every control character but TAB, including those Python's
# email package folds as line breaks (VT, FF, FS, GS, RS, NEL) and U+2028/U+2029.
_HEADER_FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
#: Longest unsubscribe URL: ``List-Unsubscribe: <url>`` must fit one header line (998 octets,
#: RFC 5322), since a URL cannot be folded.
MAX_UNSUBSCRIBE_URL_LENGTH = 900
# RFC 3986 characters, without the comma that separates List-Unsubscribe targets (RFC 2369):
# no space, no angle bracket, no quote, nothing beyond ASCII (percent-encode those).
_URL = re.compile(r"https://[A-Za-z0-9._~:/?#\[\]@!$&'()*+;=%-]+")


class InvalidEmail(ValueError):
    """A ``PreparedEmail`` that no message can be built from. A ``ValueError``: it is raised at
    enqueue, and ends an attempt FAILED ``MESSAGE_INVALID`` at once (it would always repeat)."""


class RecipientCannotReceive(OutboxError):
    """``enqueue_email`` refused: the notice says its recipient cannot receive it.

    Nothing was enqueued. ``reason`` is the notice's reason (``UNSUBSCRIBED``, ``NO_ADDRESS``...).
    """

    def __init__(self, notice: str, reason: str) -> None:
        super().__init__(f"email notice {notice!r} not enqueued: the recipient {reason}")
        self.notice = notice
        self.reason = reason


class UnknownNotice(OutboxError, LookupError):
    """No notice of that name is registered."""


@dataclass(frozen=True, slots=True)
class CannotReceive:
    """What ``prepare`` returns when nobody should get this email now.

    ``reason`` becomes the action's stop reason when it happens before an attempt (CANCELLED),
    and the ``RecipientCannotReceive`` reason at enqueue time. Keep it a short code without
    personal data: ``UNSUBSCRIBED``, ``ROLE_REMOVED``, ``NO_ADDRESS``.
    """

    reason: str

    def __post_init__(self) -> None:
        if not self.reason or _LINE_BREAK.search(self.reason):
            raise ValueError("CannotReceive.reason must be a non-empty single line")


@dataclass(frozen=True, slots=True)
class PreparedEmail:
    """One rendered email to one recipient. Checked on construction: a malformed address or a
    header value with a line break raises ``ValueError`` before anything is sent.

    ``unsubscribe_url`` (HTTPS, RFC 8058) adds ``List-Unsubscribe`` and
    ``List-Unsubscribe-Post: List-Unsubscribe=One-Click``.
    """

    to: str
    subject: str
    text: str
    html: str | None = None
    to_name: str | None = None
    unsubscribe_url: str | None = None

    def __post_init__(self) -> None:
        for name in ("to", "subject", "text", "html", "to_name", "unsubscribe_url"):
            value = getattr(self, name)
            if value is None and name in ("html", "to_name", "unsubscribe_url"):
                continue
            if not isinstance(value, str):
                raise InvalidEmail(f"PreparedEmail.{name} must be a string")
            if "\x00" in value:
                raise InvalidEmail(f"PreparedEmail.{name} must not contain a NUL character")
            if not value.isascii():
                try:
                    value.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidEmail(
                        f"PreparedEmail.{name} contains a lone surrogate (not valid Unicode)"
                    ) from None
            if name not in ("text", "html") and _HEADER_FORBIDDEN.search(value):
                raise InvalidEmail(
                    f"PreparedEmail.{name} must not contain a line break or control character"
                )
        if not self.subject.strip():
            raise InvalidEmail("PreparedEmail.subject must not be empty")
        self.address()  # raises on a malformed address
        url = self.unsubscribe_url
        if url is not None:
            if not url.startswith("https://"):
                # RFC 8058: the one-click URI MUST be HTTPS.
                raise InvalidEmail("PreparedEmail.unsubscribe_url must be an https:// URL")
            if not _URL.fullmatch(url):
                raise InvalidEmail(
                    "PreparedEmail.unsubscribe_url may hold only URL characters (RFC 3986) "
                    "without a comma: percent-encode spaces, '<', '>', '\"', ',' and non-ASCII"
                )
            if len(url) > MAX_UNSUBSCRIBE_URL_LENGTH:
                raise InvalidEmail(
                    f"PreparedEmail.unsubscribe_url is longer than "
                    f"{MAX_UNSUBSCRIBE_URL_LENGTH} characters"
                )

    def address(self) -> Address:
        """The recipient as a header address (raises ``ValueError`` when malformed)."""
        try:
            address = Address(display_name=self.to_name or "", addr_spec=self.to)
        except (ValueError, IndexError, HeaderParseError) as error:
            raise InvalidEmail(f"PreparedEmail.to is not an email address: {error}") from None
        if not address.username or not address.domain:
            raise InvalidEmail("PreparedEmail.to is not an email address")
        return address


class EmailNotice:
    """Base class of one kind of email. Subclass it, set ``name``, implement ``prepare``.

    ``prepare(event)`` returns a ``PreparedEmail``, or a ``CannotReceive`` when the recipient is
    unsubscribed, lost the role the email is for, or has no address; it may also raise
    ``RecipientCannotReceive``. It is called at enqueue time and before every attempt, so it must
    read current data, not cached data. Override ``prepare_async`` too when it does I/O that has
    an async client; by default the adapter runs ``prepare`` in a worker thread, so a blocking
    lookup never stalls the event loop.

    ``expires_after``: an email not sent within this long after enqueue is cancelled (EXPIRED);
    a late password reset is worse than none. ``None`` means it never expires.
    """

    #: The notice's name in payloads: lowercase, stable across deployments.
    name: ClassVar[str] = ""
    #: How long after enqueue the email is still worth sending.
    expires_after: ClassVar[timedelta | None] = timedelta(days=1)
    #: Attempts before a Retry becomes FAILED ATTEMPTS_EXHAUSTED.
    max_attempts: ClassVar[int] = 5

    def prepare(self, event: Mapping[str, Any]) -> PreparedEmail | CannotReceive:
        raise NotImplementedError(f"{type(self).__name__}.prepare(event)")

    async def prepare_async(self, event: Mapping[str, Any]) -> PreparedEmail | CannotReceive:
        """``prepare`` off the event loop. Override with a native async version if you have one."""
        return await asyncio.to_thread(self.prepare, event)

    def idempotency_key(self, event: Mapping[str, Any]) -> str | None:
        """The natural key of this email, or None to derive one from the notice and event."""
        return None


def checked_name(notice: EmailNotice) -> str:
    name = notice.name
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"{type(notice).__name__}.name must be lowercase letters, digits, '_', '.', '-' "
            f"(at most 100), got {name!r}"
        )
    return name


def outcome(result: object) -> PreparedEmail | CannotReceive:
    """Checks what ``prepare`` returned, so a notice bug surfaces as a clear TypeError."""
    if isinstance(result, PreparedEmail | CannotReceive):
        return result
    raise TypeError(f"EmailNotice.prepare returned {result!r}, not PreparedEmail/CannotReceive")


class NoticeRegistry:
    """Notices by name. A name has exactly one notice; a second one is a programming error."""

    def __init__(self, notices: Iterable[EmailNotice] = ()) -> None:
        self._notices: dict[str, EmailNotice] = {}
        for notice in notices:
            self.register(notice)

    def register(self, notice: EmailNotice) -> EmailNotice:
        name = checked_name(notice)
        known = self._notices.get(name)
        if known is not None and known is not notice:
            raise ValueError(f"email notice {name!r} is already registered as {known!r}")
        self._notices[name] = notice
        return notice

    def get(self, name: str) -> EmailNotice:
        try:
            return self._notices[name]
        except KeyError:
            raise UnknownNotice(f"no email notice named {name!r} is registered") from None

    def __contains__(self, name: object) -> bool:
        return name in self._notices

    def __iter__(self) -> Iterator[EmailNotice]:
        return iter(self._notices.values())
