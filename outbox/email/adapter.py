"""``EmailAdapter``: the adapter of the built-in ``EMAIL`` kind, and the only code that speaks SMTP.

One attempt: prepare the notice again from the payload's event (a recipient who can no longer
receive it ends the action CANCELLED), build the message, pass the fence, then run one SMTP
session step by step so that a failure is classified by the phase it happened in:

=========================================  ===================================================
failure                                    result
=========================================  ===================================================
connection refused or failed, greeting,    ``Retry``: the relay holds nothing yet
EHLO, STARTTLS, login (any reply)
4xx reply to MAIL, RCPT or DATA            ``Retry``: the relay said "not now"
5xx reply to MAIL, RCPT or DATA            ``Failed``: the relay refused it for good
timeout or dropped connection before DATA  ``Retry``
timeout or dropped connection once DATA    ``Uncertain``: the relay may have queued it; an
began                                      at-most-once email is never sent twice
250 after the message                      ``Done(Message-ID [queue-id=<relay's id>])``
=========================================  ===================================================

A message that cannot be built (a notice rendered a malformed address, subject or URL) ends
``Failed(MESSAGE_INVALID)`` before the fence: it would fail alike on every attempt.

Logs name the notice, the action and the Message-ID; never an address, a credential, or the
relay's reply text (relays echo addresses in it).
"""

from __future__ import annotations

import enum
import logging
import re
from collections.abc import Iterable
from datetime import timedelta

import aiosmtplib

from outbox.attempt import ActionAttempt
from outbox.email.message import RenderedMessage, render
from outbox.email.notice import (
    CannotReceive,
    EmailNotice,
    InvalidEmail,
    NoticeRegistry,
    PreparedEmail,
    RecipientCannotReceive,
    outcome,
)
from outbox.email.smtp_url import SmtpSettings
from outbox.results import Abandoned, Cancelled, Defer, Done, Failed, Result, Retry, Uncertain
from outbox.state import StopReason

log = logging.getLogger("outbox.email")

#: A payload naming a notice this process does not know goes back to wait this long (its attempt
#: given back), so that a process that has it (a newer deployment) can send it. ``expires_after``
#: bounds how long that can go on.
UNKNOWN_NOTICE_DEFER = timedelta(seconds=30)
#: Seconds to wait for the reply to QUIT once the message is accepted.
QUIT_TIMEOUT = 2.0
# A relay's queue id, where its reply names one the common ways ("250 2.0.0 Ok: queued as
# 4F1X2Y", Exim's "250 OK id=1abcDE-000123-AB"): letters, digits, '.', '_', '-', standing alone,
# so that nothing of an address (which a reply can echo) is ever taken for one.
_QUEUE_ID = re.compile(
    r"(?:\bqueued as|\bid=)\s*([A-Za-z0-9](?:[A-Za-z0-9._-]{0,62}[A-Za-z0-9])?)"
    r"(?=$|[\s;,)\]]|\.(?:\s|$))",
    re.IGNORECASE,
)


def queue_id(reply: str) -> str | None:
    """The relay's queue id in its reply to the message, when it names one unambiguously."""
    match = _QUEUE_ID.search(reply)
    return match.group(1) if match else None


def readback_ref(message_id: str, reply: str) -> str:
    """What identifies a sent email without personal data: the Message-ID, and the relay's queue
    id when its reply names one. Never the reply's text: relays echo the recipient's address."""
    queued = queue_id(reply)
    return message_id if queued is None else f"{message_id} queue-id={queued}"


class Phase(enum.Enum):
    """Where in the SMTP session a failure happened; it decides the result."""

    CONNECT = "CONNECT"
    EHLO = "EHLO"
    STARTTLS = "STARTTLS"
    LOGIN = "LOGIN"
    MAIL = "MAIL"
    RCPT = "RCPT"
    DATA = "DATA"


#: Phases before the mail transaction: whatever the reply, the relay holds nothing of it.
_BEFORE_TRANSACTION = frozenset({Phase.CONNECT, Phase.EHLO, Phase.STARTTLS, Phase.LOGIN})


def classify(phase: Phase, error: Exception) -> Result:
    """The result of an SMTP failure, by the phase it happened in (see the module's table)."""
    if isinstance(error, aiosmtplib.SMTPResponseException):
        code = error.code
        # A bad greeting is a reply to the connection: name it so an operator can tell.
        label = "GREETING" if phase is Phase.CONNECT else phase.value
        reason = f"SMTP_{label}_{code}"
        if phase in _BEFORE_TRANSACTION or 400 <= code < 500:
            return Retry(reason=reason)
        if 500 <= code < 600:
            return Failed(reason)
        # A reply that is neither success nor a refusal: only DATA can have queued something.
        return Uncertain(reason) if phase is Phase.DATA else Retry(reason=reason)
    if isinstance(error, TimeoutError):
        what = "TIMEOUT"
    elif phase is Phase.CONNECT:
        what = "FAILED"  # refused, unreachable, TLS handshake, or closed before the greeting
    elif isinstance(error, ConnectionError | aiosmtplib.SMTPServerDisconnected):
        what = "DISCONNECTED"
    else:
        what = "ERROR"
    reason = f"SMTP_{phase.value}_{what}"
    return Uncertain(reason) if phase is Phase.DATA else Retry(reason=reason)


class EmailAdapter:
    """Sends ``EMAIL`` actions through one SMTP relay.

    ``EmailAdapter(SmtpSettings.from_url(url, sender), [PasswordReset(), Welcome()])`` and
    ``outbox.register(outbox.EMAIL, adapter)``. The payload is ``{"notice": name, "event": {...}}``
    (see ``enqueue_email``); the message is rendered anew on every attempt, never stored.
    """

    def __init__(
        self, smtp: SmtpSettings, notices: Iterable[EmailNotice] | NoticeRegistry = ()
    ) -> None:
        self.smtp = smtp
        self.notices = notices if isinstance(notices, NoticeRegistry) else NoticeRegistry(notices)
        self._sender = smtp.sender_address()

    def register(self, notice: EmailNotice) -> EmailNotice:
        """Adds a notice this adapter can send."""
        return self.notices.register(notice)

    def __repr__(self) -> str:
        return f"EmailAdapter({self.smtp}, notices={[n.name for n in self.notices]})"

    async def execute(self, attempt: ActionAttempt) -> Result:
        """Prepares again, passes the fence right before connecting, and sends once."""
        payload = attempt.payload
        if (
            not isinstance(payload, dict)
            or not isinstance(payload.get("notice"), str)
            or not isinstance(payload.get("event"), dict)
        ):
            return Failed("EMAIL_BAD_PAYLOAD")
        name = payload["notice"]
        if name not in self.notices:
            log.error("email action %s names unknown notice %r: given back", attempt.id, name)
            return Defer(UNKNOWN_NOTICE_DEFER, "EMAIL_UNKNOWN_NOTICE")
        try:
            prepared = await self._prepare(self.notices.get(name), payload["event"])
        except InvalidEmail as error:
            return self._invalid(attempt, name, error)
        if isinstance(prepared, CannotReceive):
            log.info(
                "email %s action %s cancelled: recipient %s",
                name,
                attempt.id,
                prepared.reason,
                extra={"event": "email_cancelled", "action_id": attempt.id, "kind": attempt.kind},
            )
            return Cancelled(prepared.reason)
        try:
            # Built and encoded before the fence: a message that cannot be, never will be.
            rendered = render(prepared, self._sender, attempt.idempotency_key)
        except InvalidEmail as error:
            return self._invalid(attempt, name, error)
        message_id = rendered.message_id
        # The fence comes after everything that can fail without the relay, right before the
        # first byte goes to it: a refused fence means another holder owns the action. The
        # Message-ID goes on record with the fence, so an attempt that ends UNCERTAIN can still
        # be looked up at the relay by it.
        if not await attempt.fence().begin_write(message_id):
            return Abandoned()
        result = await self._send(rendered, prepared.to)
        outcome_name = type(result).__name__.lower()
        reason = getattr(result, "reason", None) or ""
        log.log(
            logging.INFO if isinstance(result, Done) else logging.WARNING,
            "email %s action %s attempt %s message_id=%s: %s %s",
            name,
            attempt.id,
            attempt.attempt,
            message_id,
            outcome_name,
            reason,
            extra={
                "event": "email_attempt",
                "action_id": attempt.id,
                "kind": attempt.kind,
                "notice": name,
                "message_id": message_id,
                "result": outcome_name,
                "reason": reason,
            },
        )
        return result

    @staticmethod
    def _invalid(attempt: ActionAttempt, name: str, error: InvalidEmail) -> Failed:
        """A message that cannot be built ends FAILED at once: every attempt would fail alike.
        Only the error's type is logged: its text can quote the recipient's address."""
        log.error(
            "email %s action %s failed: the message cannot be built (%s)",
            name,
            attempt.id,
            type(error).__name__,
            extra={"event": "email_invalid", "action_id": attempt.id, "kind": attempt.kind},
        )
        return Failed(StopReason.MESSAGE_INVALID)

    @staticmethod
    async def _prepare(notice: EmailNotice, event: dict) -> PreparedEmail | CannotReceive:
        try:
            return outcome(await notice.prepare_async(event))
        except RecipientCannotReceive as refused:
            return CannotReceive(refused.reason)

    async def _send(self, rendered: RenderedMessage, recipient: str) -> Result:
        """One SMTP session, one command at a time so each failure has a phase."""
        smtp = self.smtp
        client = aiosmtplib.SMTP(
            hostname=smtp.host,
            port=smtp.port,
            use_tls=smtp.implicit_tls,
            start_tls=False,  # we send STARTTLS ourselves, so its failure has its own phase
            timeout=smtp.timeout,
            tls_context=smtp.tls_context,
            local_hostname=smtp.local_hostname,
        )
        phase = Phase.CONNECT
        accepted = False
        try:
            await client.connect()
            phase = Phase.EHLO
            await _hello(client)
            if smtp.starttls:
                phase = Phase.STARTTLS
                await client.starttls()
                phase = Phase.EHLO
                await _hello(client)  # RFC 3207: forget what was said before TLS
            if smtp.username is not None:
                phase = Phase.LOGIN
                await client.login(smtp.username, smtp.password or "")
            phase = Phase.MAIL
            utf8 = rendered.utf8
            if utf8 and not client.supports_extension("smtputf8"):
                return Failed("SMTP_NO_SMTPUTF8")  # nothing sent yet: this relay never can
            options = ["SMTPUTF8"] if utf8 else []
            encoding = "utf-8" if utf8 else "ascii"
            await client.mail(self._sender.addr_spec, options=options, encoding=encoding)
            phase = Phase.RCPT
            await client.rcpt(recipient, encoding=encoding)
            phase = Phase.DATA
            reply = await client.data(rendered.data)
            accepted = True
        except (aiosmtplib.SMTPException, OSError, TimeoutError) as error:
            return classify(phase, error)
        finally:
            if not accepted:
                client.close()
        try:
            # A courtesy: the message is already accepted, so a relay slow to say goodbye must
            # not hold the attempt (and its lease) for a whole reply timeout.
            await client.quit(timeout=min(QUIT_TIMEOUT, smtp.timeout))
        except (aiosmtplib.SMTPException, OSError, TimeoutError):
            pass
        finally:
            client.close()
        return Done(readback_ref(rendered.message_id, reply.message))


async def _hello(client: aiosmtplib.SMTP) -> None:
    """EHLO, falling back to HELO for a relay that only speaks plain SMTP."""
    try:
        await client.ehlo()
    except aiosmtplib.SMTPHeloError:
        if not client.is_connected:
            raise
        await client.helo()
