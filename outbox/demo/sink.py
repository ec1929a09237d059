"""The demo's SMTP sink: a real aiosmtpd server in a thread, with faults chosen by the
recipient's domain, that remembers every Message-ID it accepted.

``flaky.example``: the first RCPT for each address is refused with 451 (the outbox retries);
``gone.example``: RCPT refused with 550 (the outbox fails it); ``slow.example``: the reply after
DATA comes later than the sender's timeout, although the message is accepted (UNCERTAIN: it may
have been sent, so it is never sent again).
"""

from __future__ import annotations

import asyncio
import socket
import threading
from collections import Counter
from email import message_from_bytes, policy
from typing import Any

from aiosmtpd.controller import Controller
from aiosmtpd.smtp import Envelope, Session

#: How long the sink waits before replying to DATA for slow.example (longer than the demo's
#: SMTP timeout, so the sender sees a timeout after the message reached the relay).
SLOW_REPLY_SECONDS = 3.0


class FaultySink:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._refused_once: set[str] = set()
        self.accepted: Counter[str] = Counter()  # Message-ID -> times accepted
        self._controller: Controller | None = None
        self.port = 0

    # aiosmtpd handler hooks ------------------------------------------------------------------

    async def handle_RCPT(
        self, server: Any, _session: Session, envelope: Envelope, address: str, options: Any
    ) -> str:
        domain = address.rpartition("@")[2].lower()
        if domain == "gone.example":
            return "550 5.1.1 no such mailbox"
        if domain == "flaky.example":
            with self._lock:
                first = address not in self._refused_once
                self._refused_once.add(address)
            if first:
                return "451 4.2.0 mailbox busy, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: Any, _session: Session, envelope: Envelope) -> str:
        message = message_from_bytes(envelope.original_content or b"", policy=policy.default)
        with self._lock:
            self.accepted[str(message["Message-ID"])] += 1
        if any(r.lower().endswith("@slow.example") for r in envelope.rcpt_tos):
            await asyncio.sleep(SLOW_REPLY_SECONDS)
        return "250 2.0.0 queued"

    # lifecycle -------------------------------------------------------------------------------

    def start(self) -> str:
        """Starts listening on a free local port; returns the smtp:// URL to send to."""
        with socket.socket() as probe:  # aiosmtpd's Controller needs a concrete port
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self._controller = Controller(self, hostname="127.0.0.1", port=self.port, ready_timeout=10)
        self._controller.start()
        return f"smtp://127.0.0.1:{self.port}?timeout=1.5"

    def stop(self) -> None:
        if self._controller is not None:
            self._controller.stop()
            self._controller = None

    def duplicates(self) -> int:
        with self._lock:
            return sum(n - 1 for n in self.accepted.values() if n > 1)

    def total(self) -> int:
        with self._lock:
            return sum(self.accepted.values())
