"""What the console reads from PostgreSQL: pages of actions under filters, outcomes per minute,
blocked lanes. Every statement is in ``sql/queries.sql``; these run unprepared, so the planner
sees the filters' values and picks the index of the filters that are set."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from datetime import UTC, datetime
from typing import Any

from psycopg import Connection
from psycopg.rows import dict_row

from outbox.durations import say_duration
from outbox.queries import queries_for
from outbox.state import ActionState

#: Rows a page of actions shows.
PAGE_SIZE = 50
#: Minutes the outcomes chart covers.
CHART_MINUTES = 60


@dataclass(frozen=True, slots=True)
class ActionFilter:
    """The filters of the actions list (None = any). Times are UTC."""

    state: str | None = None
    kind: str | None = None
    reason: str | None = None
    lane_key: str | None = None
    idempotency_key: str | None = None
    subject: str | None = None
    since: datetime | None = None
    until: datetime | None = None

    @classmethod
    def from_args(cls, args: Any) -> ActionFilter:
        """From a query string or a form: blanks are "any"; a state must be one; a bad time is
        ignored (the form shows it blank again) rather than failing the page."""

        def text(name: str) -> str | None:
            value = (args.get(name) or "").strip()
            return value or None

        state = text("state")
        if state is not None:
            state = state.upper()
            if state not in ActionState.__members__:
                state = None
        kind = text("kind")
        return cls(
            state=state,
            kind=kind.upper() if kind else None,
            reason=text("reason"),
            lane_key=text("lane_key"),
            idempotency_key=text("idempotency_key"),
            subject=text("subject"),
            since=_utc(text("since")),
            until=_utc(text("until")),
        )

    def is_empty(self) -> bool:
        return all(getattr(self, f.name) is None for f in fields(self))

    def params(self) -> dict[str, Any]:
        return asdict(self)

    def query_args(self) -> dict[str, str]:
        """The filter as query-string arguments (times as the form's datetime-local value)."""
        out: dict[str, str] = {}
        for name, value in asdict(self).items():
            if isinstance(value, datetime):
                out[name] = value.strftime("%Y-%m-%dT%H:%M")
            elif value is not None:
                out[name] = str(value)
        return out


def _utc(value: str | None) -> datetime | None:
    """A ``datetime-local`` value (no zone: the console shows UTC) or ISO 8601 with a zone."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    if not datetime(1970, 1, 1, tzinfo=UTC) <= parsed < datetime(9999, 1, 1, tzinfo=UTC):
        return None
    return parsed


def _rows(conn: Connection[Any], schema: str, name: str, **params: Any) -> list[dict[str, Any]]:
    with conn.cursor(row_factory=dict_row) as cur:
        cur.execute(queries_for(schema)[name], params, prepare=False)
        return cur.fetchall()


@dataclass(frozen=True, slots=True)
class ActionsPage:
    rows: list[dict[str, Any]]
    #: The keyset of the next (older) page, or None on the last page.
    older: int | None


def actions_page(
    conn: Connection[Any],
    schema: str,
    where: ActionFilter,
    before: int | None = None,
    limit: int = PAGE_SIZE,
) -> ActionsPage:
    """One page of actions, newest first, below ``before``: one more row than shown is read to
    know whether an older page exists."""
    rows = _rows(
        conn, schema, "console_actions_page", **where.params(), before=before, limit=limit + 1
    )
    older = int(rows[limit - 1]["id"]) if len(rows) > limit else None
    return ActionsPage(rows[:limit], older)


def actions_count(conn: Connection[Any], schema: str, where: ActionFilter) -> int:
    return int(_rows(conn, schema, "console_actions_count", **where.params())[0]["n"])


#: The final states the chart stacks, bottom to top.
CHART_STATES = ("DONE", "CANCELLED", "FAILED", "UNCERTAIN")


def outcomes_per_minute(conn: Connection[Any], schema: str) -> list[dict[str, int]]:
    """For each of the last 60 minutes, oldest first: how many actions ended in each state."""
    minutes = [dict.fromkeys(CHART_STATES, 0) for _ in range(CHART_MINUTES)]
    for row in _rows(conn, schema, "console_outcomes_per_minute"):
        back = int(row["minute"])
        if 0 <= back < CHART_MINUTES and row["state"] in CHART_STATES:
            minutes[CHART_MINUTES - 1 - back][row["state"]] = int(row["n"])
    return minutes


def blocked_lanes(conn: Connection[Any], schema: str, limit: int = 100) -> list[dict[str, Any]]:
    """Lanes whose head cannot run now, each with ``why`` in words."""
    lanes = _rows(conn, schema, "console_blocked_lanes", limit=limit)
    for lane in lanes:
        lane["why"] = _why_blocked(lane)
    return lanes


def _why_blocked(lane: dict[str, Any]) -> str:
    now = lane["db_now"]
    if lane["holder_id"] is not None:
        left = (lane["holder_lease_until"] - now).total_seconds()
        wrote = ", write started" if lane["holder_write_started_at"] else ""
        return (
            f"held by #{lane['holder_id']} (executing attempt {lane['holder_attempt']}{wrote}; "
            f"lease {'ends in ' + say_duration(left) if left > 0 else 'ran out, reclaim due'})"
        )
    if lane["busy_until"] is not None and lane["busy_until"] > now:
        left = (lane["busy_until"] - now).total_seconds()
        return f"held by an erased action's write for {say_duration(left)} more (its lease)"
    if lane["head_kind_paused_by"] is not None:
        return f"its head's kind {lane['head_kind']} is paused (by {lane['head_kind_paused_by']})"
    if lane["head_state"] == "PROPOSED":
        return f"head #{lane['head_id']} is a proposal waiting to be admitted or refused"
    left = (lane["head_available_at"] - now).total_seconds()
    reason = lane["head_retry_reason"] or "-"
    return (
        f"head #{lane['head_id']} waits for its retry in {say_duration(left)} "
        f"(attempt {lane['head_attempt']} of {lane['head_max_attempts']}, last reason {reason})"
    )


def uncertain_page(
    conn: Connection[Any],
    schema: str,
    *,
    unresolved: bool = False,
    before: int | None = None,
    limit: int = PAGE_SIZE,
) -> list[dict[str, Any]]:
    """UNCERTAIN actions, newest first, with their provider reference (the Message-ID for
    email) and resolution; ``unresolved`` leaves out those a person resolved."""
    return _rows(
        conn, schema, "console_uncertain_page", unresolved=unresolved, before=before, limit=limit
    )
