"""A real aiosmtpd SMTP server (in a thread) with faults injected per SMTP phase.

``SmtpSink.inject(phase, fault)`` arms one fault for the next session that reaches that phase:
a reply line (``"451 4.3.0 try later"``), ``"drop"`` (abort the connection instead of replying),
or ``"slow:<seconds>"`` (reply 250 after that long). Phases: ``greeting``, ``auth``, ``mail``,
``rcpt``, ``data`` (the reply after the message). The sink records every connection, every
message it saw in DATA, and the messages it accepted (replied 250 to).
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import threading
from collections import defaultdict, deque
from dataclasses import dataclass
from email import message_from_bytes, policy
from email.message import EmailMessage
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import SMTP, AuthResult, Envelope, LoginPassword, Session


@dataclass(frozen=True)
class Received:
    mail_from: str
    rcpt_tos: tuple[str, ...]
    message: EmailMessage
    tls: bool

    @property
    def message_id(self) -> str:
        return str(self.message["Message-ID"])


def free_port() -> int:
    """A port nothing listens on (bound and released at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class SmtpSink:
    def __init__(
        self,
        username: str | None = None,
        password: str | None = None,
        *,
        starttls: ssl.SSLContext | None = None,
        implicit_tls: ssl.SSLContext | None = None,
    ) -> None:
        self.username = username
        self.password = password
        self.starttls = starttls
        self.implicit_tls = implicit_tls
        self._lock = threading.Lock()
        self._faults: dict[str, deque[str]] = defaultdict(deque)
        self.connections = 0
        self.auth_attempts = 0
        self.seen: list[Received] = []  # every message that reached the end of DATA
        self.accepted: list[Received] = []  # those the sink replied 250 to
        self._controller: _Controller | None = None
        self.port = 0

    # -- test side ---------------------------------------------------------------------------

    def inject(self, phase: str, fault: str, times: int = 1) -> None:
        with self._lock:
            self._faults[phase].extend([fault] * times)

    def take(self, phase: str) -> str | None:
        with self._lock:
            queue = self._faults[phase]
            return queue.popleft() if queue else None

    def accepted_ids(self) -> list[str]:
        with self._lock:
            return [r.message_id for r in self.accepted]

    def seen_ids(self) -> list[str]:
        with self._lock:
            return [r.message_id for r in self.seen]

    @property
    def url(self) -> str:
        auth = f"{self.username}:{self.password}@" if self.username else ""
        scheme = "smtps" if self.implicit_tls else "smtp"
        query = "?starttls=true" if self.starttls else ""
        return f"{scheme}://{auth}127.0.0.1:{self.port}{query}"

    def start(self, port: int | None = None) -> SmtpSink:
        """Listens on ``port`` (a relay that comes back where it was), else on a free one."""
        kwargs: dict[str, Any] = {}
        if self.username is not None:
            kwargs.update(
                authenticator=self._authenticate,
                auth_required=True,
                # STARTTLS: AUTH only once TLS is up (aiosmtpd cannot tell implicit TLS apart).
                auth_require_tls=self.starttls is not None,
            )
        if self.starttls is not None:
            kwargs.update(tls_context=self.starttls, require_starttls=True)
        if self.implicit_tls is not None:
            kwargs.update(ssl_context=self.implicit_tls)
        self.port = port or free_port()
        self._controller = _Controller(
            _Handler(self), sink=self, hostname="127.0.0.1", port=self.port, **kwargs
        )
        self._controller.start()
        with self._lock:
            self.connections = 0  # the controller's own readiness probe is not a client
        return self

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()

    # -- server side (the controller's thread) -------------------------------------------------

    def _authenticate(
        self, server: SMTP, session: Session, envelope: Envelope, mechanism: str, auth_data: Any
    ) -> AuthResult:
        with self._lock:
            self.auth_attempts += 1
        # An injected fault refuses every mechanism the client tries in that session, as a
        # relay with wrong credentials does.
        if getattr(session, "refuse_auth", False) or self.take("auth") is not None:
            session.refuse_auth = True  # type: ignore[attr-defined]
            return AuthResult(success=False, handled=False)
        ok = isinstance(auth_data, LoginPassword) and (
            auth_data.login.decode() == self.username
            and auth_data.password.decode() == self.password
        )
        return AuthResult(success=ok)

    def _record(self, server: SMTP, envelope: Envelope) -> Received:
        """Called with the whole message in hand (end of DATA)."""
        content = envelope.original_content or b""
        transport = server.transport
        received = Received(
            mail_from=str(envelope.mail_from),
            rcpt_tos=tuple(envelope.rcpt_tos),
            message=message_from_bytes(content, policy=policy.default),  # type: ignore[arg-type]
            tls=transport is not None and transport.get_extra_info("ssl_object") is not None,
        )
        with self._lock:
            self.seen.append(received)
        return received

    def _accept(self, received: Received) -> int:
        with self._lock:
            self.accepted.append(received)
            return len(self.accepted)


class _FaultySMTP(SMTP):
    """aiosmtpd's server, able to refuse at the greeting."""

    def __init__(self, *args: Any, sink: SmtpSink, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._sink = sink

    async def _handle_client(self) -> None:
        with self._sink._lock:
            self._sink.connections += 1
        fault = self._sink.take("greeting")
        if fault is not None:
            await self.push(fault)
            assert self.transport is not None
            self.transport.close()
            return
        await super()._handle_client()


class _Controller(Controller):
    def __init__(self, handler: Any, *, sink: SmtpSink, **kwargs: Any) -> None:
        super().__init__(handler, **kwargs)
        self._sink = sink

    def factory(self) -> SMTP:
        return _FaultySMTP(self.handler, sink=self._sink, **self.SMTP_kwargs)


class _Handler:
    def __init__(self, sink: SmtpSink) -> None:
        self.sink = sink

    async def handle_MAIL(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list
    ) -> str:
        fault = self.sink.take("mail")
        if fault is not None:
            return fault
        envelope.mail_from = address
        envelope.mail_options.extend(options)
        return "250 OK"

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list
    ) -> str:
        fault = self.sink.take("rcpt")
        if fault is not None:
            return fault
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        fault = self.sink.take("data")
        received = self.sink._record(server, envelope)
        if fault == "drop":
            # The whole message arrived; the connection dies before the relay's answer.
            assert server.transport is not None
            server.transport.abort()
            return "250 OK (never sent)"
        if fault is not None and fault.startswith("slow:"):
            # The relay queued the message, then its answer is late: the case that makes a
            # retry a duplicate.
            self.sink._accept(received)
            await asyncio.sleep(float(fault.split(":", 1)[1]))
            return "250 2.0.0 OK queued late"
        if fault is not None:
            return fault
        number = self.sink._accept(received)
        return f"250 2.0.0 OK queued as {number}"
