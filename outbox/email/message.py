"""Builds the ``EmailMessage`` an attempt sends, with the headers every outbox email carries, and
the bytes that go to the relay."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from email import policy
from email.errors import MessageError
from email.header import Header
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, localtime

from outbox.email.notice import InvalidEmail, PreparedEmail

# ``List-Unsubscribe`` is set raw (a URL must never be folded or RFC 2047-encoded, which would
# break it), and a raw header is only written as it is when the policy does not refold it.
_SMTP = policy.SMTP.clone(refold_source="none")
_SMTPUTF8 = policy.SMTPUTF8.clone(refold_source="none")
#: The sender a message is built with at enqueue time, where the relay's settings are unknown;
#: only ``From`` and the Message-ID's domain depend on it.
_PLACEHOLDER_SENDER = Address("Outbox", "outbox", "sender.invalid")


def message_id_for(idempotency_key: str, sender: Address) -> str:
    """``<hash@sender-domain>``: the same for every attempt of one action, so a relay or a
    mailbox that saw an earlier copy can recognise a duplicate. The key is hashed so that no
    application identifier (or personal data in it) shows in the header."""
    digest = hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:40]
    return f"<{digest}.outbox@{sender.domain}>"


def build_message(prepared: PreparedEmail, sender: Address, idempotency_key: str) -> EmailMessage:
    """A text part and, when given, an HTML alternative, with:

    - ``Message-ID`` from ``message_id_for`` (stable across attempts);
    - ``Auto-Submitted: auto-generated`` (RFC 3834) and ``X-Auto-Response-Suppress: All``, so
      vacation responders and Exchange auto-replies stay silent;
    - ``List-Unsubscribe`` and ``List-Unsubscribe-Post: List-Unsubscribe=One-Click`` (RFC 8058)
      when the notice gives an unsubscribe URL.
    """
    message = EmailMessage()
    message["From"] = sender
    message["To"] = prepared.address()
    if prepared.subject.isascii():
        message["Subject"] = prepared.subject
    else:
        # The email package's own folding of a long non-ASCII subject can drop the whitespace
        # between two encoded words, so the subject arrives changed; the older encoder keeps it
        # (RFC 2047 words of at most 75 characters), and a raw header is written as it is.
        encoded = Header(prepared.subject, "utf-8", header_name="Subject").encode()
        message.set_raw("Subject", encoded)
    message["Date"] = format_datetime(localtime())
    message["Message-ID"] = message_id_for(idempotency_key, sender)
    message["Auto-Submitted"] = "auto-generated"
    message["X-Auto-Response-Suppress"] = "All"
    if prepared.unsubscribe_url:
        message.set_raw("List-Unsubscribe", f"<{prepared.unsubscribe_url}>")
        message["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    message.set_content(prepared.text)
    if prepared.html is not None:
        message.add_alternative(prepared.html, subtype="html")
    return message


def needs_smtputf8(sender: Address, recipient: str) -> bool:
    """Whether the envelope (and so the message) needs SMTPUTF8 (RFC 6531)."""
    return not (sender.addr_spec.isascii() and recipient.isascii())


def message_bytes(message: EmailMessage, utf8: bool) -> bytes:
    """The message as it goes to the relay after DATA."""
    return message.as_bytes(policy=_SMTPUTF8 if utf8 else _SMTP)


@dataclass(frozen=True, slots=True)
class RenderedMessage:
    """One attempt's message, ready for the relay."""

    message_id: str
    data: bytes
    #: Whether the session needs SMTPUTF8 (a non-ASCII sender or recipient).
    utf8: bool


def render(prepared: PreparedEmail, sender: Address, idempotency_key: str) -> RenderedMessage:
    """``build_message`` and ``message_bytes`` in one; whatever keeps the message from being
    built raises ``InvalidEmail``."""
    try:
        message = build_message(prepared, sender, idempotency_key)
        utf8 = needs_smtputf8(sender, prepared.to)
        return RenderedMessage(str(message["Message-ID"]), message_bytes(message, utf8), utf8)
    except InvalidEmail:
        raise
    except (ValueError, TypeError, LookupError, MessageError) as error:
        raise InvalidEmail(f"the message cannot be built: {error}") from None


def check_buildable(prepared: PreparedEmail, idempotency_key: str) -> None:
    """Builds ``prepared`` as an attempt would, with either SMTP policy (the relay's sender is
    unknown here, so whether SMTPUTF8 is used is too); raises ``InvalidEmail`` when it cannot."""
    try:
        message = build_message(prepared, _PLACEHOLDER_SENDER, idempotency_key)
        message_bytes(message, utf8=True)
        if prepared.to.isascii():
            message_bytes(message, utf8=False)
    except InvalidEmail:
        raise
    except (ValueError, TypeError, LookupError, MessageError) as error:
        raise InvalidEmail(f"the message cannot be built: {error}") from None
