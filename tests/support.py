"""Adapters and helpers shared by the core tests: they record what really happened."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg

from outbox import Abandoned, ActionAttempt, Done, Result


@dataclass
class Recorder:
    """Counts calls per action and checks, inside the adapter, that no two of a lane overlap."""

    calls: dict[int, int] = field(default_factory=lambda: defaultdict(int))
    order: dict[str, list[int]] = field(default_factory=lambda: defaultdict(list))
    running: dict[str, int] = field(default_factory=dict)
    overlaps: list[tuple[str, int, int]] = field(default_factory=list)
    attempts: list[ActionAttempt] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def enter(self, attempt: ActionAttempt) -> None:
        with self.lock:
            other = self.running.get(attempt.lane_key)
            if other is not None:
                self.overlaps.append((attempt.lane_key, other, attempt.id))
            self.running[attempt.lane_key] = attempt.id
            self.calls[attempt.id] += 1
            self.order[attempt.lane_key].append(attempt.id)
            self.attempts.append(attempt)

    def leave(self, attempt: ActionAttempt) -> None:
        with self.lock:
            if self.running.get(attempt.lane_key) == attempt.id:
                del self.running[attempt.lane_key]


class ScriptedAdapter:
    """Returns what ``script(attempt)`` says, after passing the fence (unless told not to).

    ``script`` may return a Result, raise, or return the string "raise-after-fence".
    """

    def __init__(
        self,
        script: Callable[[ActionAttempt], Any] | None = None,
        *,
        fence: bool = True,
        delay: float = 0.0,
        recorder: Recorder | None = None,
    ) -> None:
        self.script = script or (lambda attempt: Done(f"ref-{attempt.id}"))
        self.fence = fence
        self.delay = delay
        self.recorder = recorder or Recorder()

    async def execute(self, attempt: ActionAttempt) -> Result:
        self.recorder.enter(attempt)
        try:
            if self.delay:
                await asyncio.sleep(self.delay)
            if self.fence and not await attempt.fence().begin_write():
                return Abandoned()
            outcome = self.script(attempt)
            if isinstance(outcome, BaseException):
                raise outcome
            return outcome
        finally:
            self.recorder.leave(attempt)


def rows(conn: psycopg.Connection, schema: str, where: str = "true") -> list[dict[str, Any]]:
    with conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        cur.execute(f'SELECT * FROM "{schema}".agent_action WHERE {where} ORDER BY id')
        return cur.fetchall()


def fold_lane_intake(conn: psycopg.Connection, schema: str) -> int:
    """Folds every pending lane-intake row into the lane rows, as a claim does first."""
    return conn.execute(f'SELECT "{schema}".agent_action_lane_intake(1000000)').fetchone()[0]


def lanes(conn: psycopg.Connection, schema: str) -> list[tuple]:
    """The lane rows, once the lane intake is folded (as every claim does first). Checks too
    that no row is out of the claim's index while its head is due, nor in it while its head
    is scheduled for later (a second of slack for the fold's own clock)."""
    fold_lane_intake(conn, schema)
    misplaced = conn.execute(
        f"SELECT lane_key, head_due_at, head_scheduled, now() "
        f'FROM "{schema}".agent_action_lane '
        "WHERE (NOT head_scheduled AND head_due_at > now())"
        " OR (head_scheduled AND head_due_at <= now() - interval '1 second')"
    ).fetchall()
    assert not misplaced, misplaced
    return conn.execute(
        f"SELECT lane_key, head_id, head_kind, head_due_at, executing_id "
        f'FROM "{schema}".agent_action_lane ORDER BY lane_key'
    ).fetchall()


def expected_lanes(conn: psycopg.Connection, schema: str) -> list[tuple]:
    """The lane rows recomputed from agent_action alone (the invariant the triggers keep): a row
    for each lane with a waiting action, naming its head and its executing action."""
    return conn.execute(
        f"""
        WITH keys AS (
            SELECT DISTINCT lane_key FROM "{schema}".agent_action
             WHERE state IN ('PROPOSED', 'ADMITTED'))
        SELECT k.lane_key, h.id, h.kind,
               CASE WHEN h.state = 'ADMITTED' THEN h.available_at END,
               (SELECT x.id FROM "{schema}".agent_action x
                 WHERE x.lane_key = k.lane_key AND x.state = 'EXECUTING')
          FROM keys k
          LEFT JOIN LATERAL (
              SELECT a.id, a.kind, a.state, a.available_at FROM "{schema}".agent_action a
               WHERE a.lane_key = k.lane_key AND a.state IN ('PROPOSED', 'ADMITTED')
               ORDER BY a.id LIMIT 1) h ON true
         ORDER BY k.lane_key
        """
    ).fetchall()


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0, step: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step)
    return predicate()


#: psycopg's named placeholders, ``%(name)s``.
_PARAM = re.compile(r"%\((\w+)\)s")


def _positional(sql: str) -> tuple[str, list[str]]:
    """``sql`` with psycopg's ``%(name)s`` as ``$1``, ``$2``... and the names in that order."""
    names: list[str] = []

    def number(match: re.Match[str]) -> str:
        if match.group(1) not in names:
            names.append(match.group(1))
        return f"${names.index(match.group(1)) + 1}"

    return _PARAM.sub(number, sql), names


def plan_nodes(node: dict[str, Any], node_type: str) -> list[dict[str, Any]]:
    """The plan's nodes of one type, at any depth."""
    own = [node] if node["Node Type"] == node_type else []
    return own + [n for child in node.get("Plans", []) for n in plan_nodes(child, node_type)]


def generic_plan(
    conn: psycopg.Connection[Any],
    sql: str,
    params: dict[str, Any],
    mode: str = "force_generic_plan",
) -> dict:
    """EXPLAIN ANALYZE of ``sql``'s generic plan with ``params``, rolled back; with ``mode``
    ``force_custom_plan``, of the plan made for these values (a statement's first runs on a
    connection, before psycopg prepares it and PostgreSQL settles on a generic plan)."""
    positional, names = _positional(sql)
    with conn.transaction(force_rollback=True):
        conn.execute(f"SET LOCAL plan_cache_mode = {mode}")
        conn.execute(f"PREPARE batched AS {positional}")
        args = ", ".join(f"%({name})s" for name in names)
        # The values inlined by the client: EXECUTE's arguments take no server-side parameters.
        (plan,) = (
            psycopg.ClientCursor(conn)
            .execute(f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE batched({args})", params)
            .fetchone()
        )
        conn.execute("DEALLOCATE batched")
    return (plan if isinstance(plan, list) else json.loads(plan))[0]["Plan"]
