"""The soak's SMTP relay, in a process of its own so that it outlives every kill:
``python -m benchmarks.chaos.sink DATABASE_URL WORLD_SCHEMA PORT``.

A real aiosmtpd server. It commits every Message-ID it accepts to ``<world>.smtp_accepted``
before it replies 250 (a relay that has queued a message has it, whether or not the client hears
the reply). Faults come from the recipient's address (see ``benchmarks.chaos.app.recipient``) and
are counted per recipient here, so each email meets its faults on its first attempts:

- ``+rK``: RCPT refused with ``451`` K times (the relay holds nothing: the adapter retries);
- ``+dK``: the whole message arrives, then ``451`` K times (not queued: retried);
- ``+s``: accepted, then the 250 comes late (``SLOW_REPLY`` s): a window for kills after the
  relay has the message and before the action's finish.
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections import Counter
from email.parser import BytesHeaderParser
from typing import Any

import psycopg
from aiosmtpd.smtp import SMTP, Envelope, Session
from psycopg_pool import AsyncConnectionPool

#: Seconds a ``+s`` recipient's 250 is held back (well inside the soak's 2 s write margin).
SLOW_REPLY = 0.6
#: What the sink prints once it listens.
READY = "chaos sink ready"

_FAULT = re.compile(r"\+(r\d+|d\d+|s)@")


def fault_of(address: str) -> str:
    match = _FAULT.search(address)
    return match.group(1) if match else ""


class Handler:
    def __init__(self, pool: AsyncConnectionPool, world: str) -> None:
        self.pool = pool
        self.table = f'"{world}".smtp_accepted'
        # Refusals given so far, per recipient and phase: the sink is never killed, so they hold.
        self.refused: Counter[tuple[str, str]] = Counter()

    def _refuse(self, address: str, phase: str) -> bool:
        fault = fault_of(address)
        if not fault.startswith(phase):
            return False
        if self.refused[(address, phase)] >= int(fault[1:]):
            return False
        self.refused[(address, phase)] += 1
        return True

    async def handle_RCPT(
        self, server: SMTP, session: Session, envelope: Envelope, address: str, options: list
    ) -> str:
        if self._refuse(address, "r"):
            return "451 4.3.0 mailbox busy, try again later"
        envelope.rcpt_tos.append(address)
        return "250 OK"

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        recipient = envelope.rcpt_tos[0]
        if self._refuse(recipient, "d"):
            return "451 4.3.0 queue full, try again later"
        content: Any = envelope.original_content or b""
        # A long Message-ID arrives folded onto a continuation line: unfold it.
        message_id = "".join(str(BytesHeaderParser().parsebytes(content)["Message-ID"]).split())
        try:
            async with self.pool.connection() as conn:
                await conn.execute(
                    f"INSERT INTO {self.table} (message_id, recipient) VALUES (%s, %s)",
                    (message_id, recipient),
                )
        except psycopg.Error:
            # The relay's queue (the database) is down: not queued, the sender tries again.
            return "451 4.3.0 queue unavailable, try again later"
        if fault_of(recipient) == "s":
            await asyncio.sleep(SLOW_REPLY)
        return "250 2.0.0 OK queued"


async def serve(database_url: str, world: str, port: int) -> None:
    pool = AsyncConnectionPool(
        database_url,
        min_size=1,
        max_size=4,
        kwargs={"autocommit": True},
        # A connection a database restart broke is replaced before it is used.
        check=AsyncConnectionPool.check_connection,
        open=False,
    )
    await pool.open(wait=True)
    handler = Handler(pool, world)
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: SMTP(handler, hostname="127.0.0.1"), host="127.0.0.1", port=port
    )
    print(f"{READY} on port {port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str]) -> None:
    database_url, world, port = argv
    asyncio.run(serve(database_url, world, int(port)))


if __name__ == "__main__":
    main(sys.argv[1:])
