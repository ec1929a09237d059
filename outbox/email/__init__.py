"""Email over SMTP: the built-in ``EMAIL`` kind's notices, adapter and enqueue.

``EmailNotice`` renders one kind of email from an event and checks that its recipient can still
receive it; ``enqueue_email`` records one in the caller's transaction; ``EmailAdapter`` (the only
code that imports aiosmtplib) sends it, once at most.
"""

from outbox.email.adapter import EmailAdapter
from outbox.email.enqueue import enqueue_email, enqueue_email_async
from outbox.email.message import build_message, message_id_for
from outbox.email.notice import (
    CannotReceive,
    EmailNotice,
    InvalidEmail,
    NoticeRegistry,
    PreparedEmail,
    RecipientCannotReceive,
    UnknownNotice,
)
from outbox.email.smtp_url import SmtpSettings

__all__ = [
    "CannotReceive",
    "EmailAdapter",
    "EmailNotice",
    "InvalidEmail",
    "NoticeRegistry",
    "PreparedEmail",
    "RecipientCannotReceive",
    "SmtpSettings",
    "UnknownNotice",
    "build_message",
    "enqueue_email",
    "enqueue_email_async",
    "message_id_for",
]
