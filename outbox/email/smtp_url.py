"""SMTP settings from one URL plus a sender address.

``smtp://host:25`` (plain), ``smtp://host:587?starttls=true`` (STARTTLS, required: the session
fails rather than continue in clear), ``smtps://host:465`` (TLS from the first byte), with
``user:password@`` (percent-encoded) for AUTH and ``timeout=<seconds>`` for each SMTP reply.
Neither user name nor password is part of ``repr`` or ``str``, so settings can be logged safely.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass, field
from email.errors import HeaderParseError
from email.headerregistry import Address
from email.utils import parseaddr
from urllib.parse import parse_qs, unquote, urlsplit

from outbox.config import ENV_PREFIX
from outbox.errors import ConfigurationError

#: Seconds to wait for each SMTP reply (and for the connection). Short enough that a hung relay
#: ends the attempt well inside the fence's write margin (60 s by default).
DEFAULT_TIMEOUT = 20.0

# Every control character but TAB, and the Unicode line separators Python's email package folds.
_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")

_TRUE = {"1", "true", "yes", "on", ""}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True, slots=True)
class SmtpSettings:
    """Where and how to reach the relay, and who the mail is from."""

    host: str
    port: int
    sender: str
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    implicit_tls: bool = False
    starttls: bool = False
    timeout: float = DEFAULT_TIMEOUT
    #: TLS context for smtps:// and STARTTLS (default: the system's, verifying certificates).
    tls_context: ssl.SSLContext | None = field(default=None, repr=False, compare=False)
    #: The name sent in EHLO (default: this host's FQDN).
    local_hostname: str | None = None

    def __post_init__(self) -> None:
        if self.implicit_tls and self.starttls:
            raise ConfigurationError("SMTP URL: smtps:// already uses TLS; drop starttls")
        if self.timeout <= 0:
            raise ConfigurationError("SMTP URL: timeout must be > 0 seconds")
        self.sender_address()  # raises on a malformed sender

    @classmethod
    def from_url(
        cls,
        url: str,
        sender: str,
        *,
        tls_context: ssl.SSLContext | None = None,
        local_hostname: str | None = None,
    ) -> SmtpSettings:
        """Parses ``smtp[s]://[user[:password]@]host[:port][?starttls=true&timeout=10]``."""
        parts = urlsplit(url)
        scheme = parts.scheme.lower()
        if scheme not in ("smtp", "smtps"):
            raise ConfigurationError(f"SMTP URL: scheme must be smtp or smtps, not {scheme!r}")
        if not parts.hostname:
            raise ConfigurationError("SMTP URL: no host")
        try:
            explicit_port = parts.port
        except ValueError:
            raise ConfigurationError("SMTP URL: the port is not a number") from None
        query = {k: v[-1] for k, v in parse_qs(parts.query, keep_blank_values=True).items()}
        unknown = set(query) - {"starttls", "timeout"}
        if unknown:
            raise ConfigurationError(f"SMTP URL: unknown parameter(s) {sorted(unknown)}")
        starttls = _flag(query.get("starttls", "false"))
        implicit_tls = scheme == "smtps"
        default_port = 465 if implicit_tls else 587 if starttls else 25
        try:
            timeout = float(query.get("timeout", DEFAULT_TIMEOUT))
        except ValueError:
            raise ConfigurationError("SMTP URL: timeout is not a number") from None
        return cls(
            host=parts.hostname,
            port=explicit_port or default_port,
            sender=sender,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password is not None else None,
            implicit_tls=implicit_tls,
            starttls=starttls,
            timeout=timeout,
            tls_context=tls_context,
            local_hostname=local_hostname,
        )

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> SmtpSettings:
        """From ``OUTBOX_SMTP_URL`` and ``OUTBOX_SMTP_SENDER``."""
        env = os.environ if environ is None else environ
        url = env.get(f"{ENV_PREFIX}SMTP_URL")
        sender = env.get(f"{ENV_PREFIX}SMTP_SENDER")
        if not url or not sender:
            raise ConfigurationError(
                f"email: set {ENV_PREFIX}SMTP_URL (smtp://...) and {ENV_PREFIX}SMTP_SENDER"
            )
        return cls.from_url(url, sender)

    def sender_address(self) -> Address:
        """The ``From`` address; its domain names every Message-ID. A sender with a control
        character (a line break would end the header) is refused, never cut down to a part."""
        if not isinstance(self.sender, str) or _CONTROL.search(self.sender):
            raise ConfigurationError(
                f"email sender {self.sender!r} must not contain a line break or control character"
            )
        name, addr = parseaddr(self.sender)
        try:
            address = Address(display_name=name, addr_spec=addr)
        except (ValueError, IndexError, HeaderParseError):
            address = None
        # parseaddr drops what it cannot read ("a@b.com junk" gives "a@b.comjunk"): an address
        # that is not in the setting as written is a misread, not the sender.
        if (
            address is None
            or not address.username
            or not address.domain
            or address.addr_spec not in self.sender
        ):
            raise ConfigurationError(f"email sender {self.sender!r} is not an email address")
        return address

    def __str__(self) -> str:
        """The URL without its credentials (safe to log: a user name may be an API key)."""
        scheme = "smtps" if self.implicit_tls else "smtp"
        user = "***@" if self.username else ""
        tls = "?starttls=true" if self.starttls else ""
        return f"{scheme}://{user}{self.host}:{self.port}{tls}"


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ConfigurationError(f"SMTP URL: starttls={raw!r} is not true or false")
