"""The read-back provider: a small comment store in PostgreSQL, searchable by marker, and the
adapter of the soak's read-back kind that posts to it.

The store is "the outside world" to the outbox: it lives in its own schema, on its own pool, and
every call is one autocommit statement, never inside an action's transaction. A post can be
refused with an injected provider error; the refusal and the post are one statement, so a refused
post provably wrote nothing (the adapter may then return ``Retry``).
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from typing import Any

from psycopg_pool import AsyncConnectionPool

from benchmarks.chaos.recording import Recorder, run_recorded
from outbox import Abandoned, ActionAttempt, ActionKind, Done, Result, Retry

#: The soak's read-back kind: its adapter can search for its earlier write.
COMMENT = ActionKind("CHAOS_COMMENT")
#: How long a refused post waits before its retry (short, so the soak retries a lot).
RETRY_AFTER = timedelta(seconds=0.3)

_POST = """
WITH fault AS (
    UPDATE {w}.comment_fault SET remaining = remaining - 1
     WHERE marker = %(marker)s AND remaining > 0
    RETURNING 1)
INSERT INTO {w}.comment (marker, body)
SELECT %(marker)s, %(body)s WHERE NOT EXISTS (SELECT 1 FROM fault)
RETURNING id
"""


class CommentStore:
    """``search(marker)`` and ``post(marker, body)`` against ``<run>_world.comment``."""

    def __init__(self, database_url: str, world_schema: str) -> None:
        self.database_url = database_url
        self.w = f'"{world_schema}"'
        self._pool: AsyncConnectionPool | None = None
        self._pid = 0
        self._lock = asyncio.Lock()

    async def _rows(self, query: str, params: dict[str, Any]) -> list[tuple[Any, ...]]:
        async with self._lock:
            if self._pool is None or self._pid != os.getpid():
                pool = AsyncConnectionPool(
                    self.database_url,
                    min_size=1,
                    max_size=4,
                    kwargs={"autocommit": True},
                    # A connection a database restart broke is replaced before it is used.
                    check=AsyncConnectionPool.check_connection,
                    open=False,
                )
                await pool.open(wait=True)
                self._pool, self._pid = pool, os.getpid()
        async with self._pool.connection() as conn:
            cur = await conn.execute(query.format(w=self.w), params)
            return await cur.fetchall()

    async def search(self, marker: str) -> list[int]:
        """Ids of the comments carrying ``marker``, oldest first."""
        rows = await self._rows(
            "SELECT id FROM {w}.comment WHERE marker = %(marker)s ORDER BY id", {"marker": marker}
        )
        return [row[0] for row in rows]

    async def post(self, marker: str, body: str) -> int | None:
        """The new comment's id, or None when the store refused it (an injected provider error;
        then nothing was written)."""
        rows = await self._rows(_POST, {"marker": marker, "body": body})
        return rows[0][0] if rows else None


class CommentAdapter:
    """Posts one comment per action, with the idempotency key as its marker.

    After a lost lease (``attempt.write_started``) it searches for its marker first and reports
    the comment it finds instead of posting again. Payload knobs: ``linger`` (seconds to pause
    after the fence, before posting) and ``linger_after`` (after posting, before ``Done``), so
    that kills land on both sides of the write.
    """

    def __init__(self, store: CommentStore, recorder: Recorder) -> None:
        self.store = store
        self.recorder = recorder

    async def execute(self, attempt: ActionAttempt) -> Result:
        payload = attempt.payload or {}
        return await run_recorded(
            self.recorder,
            attempt,
            float(payload.get("linger", 0)),
            lambda recorded: self._post(recorded, float(payload.get("linger_after", 0))),
        )

    async def _post(self, attempt: Any, linger_after: float) -> Result:
        marker = attempt.idempotency_key
        if attempt.write_started:
            found = await self.store.search(marker)
            if found:
                return Done(ref=f"comment-{found[0]}")
        if not await attempt.fence().begin_write():
            return Abandoned()
        posted = await self.store.post(marker, f"comment of action {attempt.id}")
        if posted is None:
            return Retry(after=RETRY_AFTER, reason="COMMENT_STORE_UNAVAILABLE")
        if linger_after > 0:
            await asyncio.sleep(linger_after)
        return Done(ref=f"comment-{posted}")
