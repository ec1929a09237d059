"""Builds the ``EmailMessage`` an attempt sends, with the headers every outbox email carries."""

from __future__ import annotations

import hashlib
from email.headerregistry import Address
from email.message import EmailMessage
from email.utils import format_datetime, localtime

from outbox.email.notice import PreparedEmail


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
    message["Subject"] = prepared.subject
    message["Date"] = format_datetime(localtime())
    message["Message-ID"] = message_id_for(idempotency_key, sender)
    message["Auto-Submitted"] = "auto-generated"
    message["X-Auto-Response-Suppress"] = "All"
    if prepared.unsubscribe_url:
        message["List-Unsubscribe"] = f"<{prepared.unsubscribe_url}>"
        message["List-Unsubscribe-Post"] = "List-Unsubscribe=One-Click"
    message.set_content(prepared.text)
    if prepared.html is not None:
        message.add_alternative(prepared.html, subtype="html")
    return message
