"""The data behind ``outbox status`` and ``outbox inspect ID``, as plain dicts ready for JSON.

Status: per kind and state counts, each kind's backlog (due, oldest due age, in flight, blocked
lanes), and the latest UNCERTAIN and FAILED actions. Inspect: one action's fields, its lane, and
its history as far as the row keeps it (created, attempts, write started, lease, ended). Neither
shows a payload in the status; inspect shows the payload of a live action (ended rows keep none).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from typing import Any

from outbox._io import Operation, Statement, psycopg_connection, run_sync
from outbox.action import Action
from outbox.backlog import backlog_operation
from outbox.enqueuing import default_schema
from outbox.queries import queries_for
from outbox.state import ActionState

#: How many of the latest UNCERTAIN and FAILED actions ``status`` lists.
LATEST = 10


@dataclass(frozen=True, slots=True)
class StatusReport:
    """What ``outbox status`` prints. ``counts[kind][state]``; ``backlog[kind]`` holds due,
    oldest_due_age (seconds), in_flight, queue and blocked_lanes."""

    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    backlog: dict[str, dict[str, Any]] = field(default_factory=dict)
    latest_uncertain: list[dict[str, Any]] = field(default_factory=list)
    latest_failed: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def status_operation(schema: str, latest: int = LATEST) -> Operation[StatusReport]:
    q = queries_for(schema)
    backlog = yield from backlog_operation(schema)
    counts: dict[str, dict[str, int]] = {kind: {} for kind in backlog.kinds}
    for row in (yield Statement(q["counts_by_kind_and_state"])):
        counts.setdefault(row["kind"], {})[row["state"]] = int(row["n"])
    ended: dict[str, list[dict[str, Any]]] = {}
    for state in (ActionState.UNCERTAIN, ActionState.FAILED):
        rows = yield Statement(q["latest_ended_in_state"], {"state": state.value, "limit": latest})
        ended[state.value] = [dict(r) for r in rows]
    return StatusReport(
        counts=counts,
        backlog={
            kind: {**asdict(item), "queue": item.queue} for kind, item in backlog.kinds.items()
        },
        latest_uncertain=ended[ActionState.UNCERTAIN.value],
        latest_failed=ended[ActionState.FAILED.value],
    )


def _history(action: Action) -> list[dict[str, Any]]:
    """The events the row still shows, in time order. Earlier attempts leave no trace of their
    own beyond the attempt and epoch counters."""
    events: list[tuple[datetime, str, str]] = [(action.created_at, "created", "")]
    if action.write_started_at:
        events.append(
            (action.write_started_at, "write_started", f"attempt {action.attempt} passed its fence")
        )
    if action.state is ActionState.EXECUTING and action.lease_until:
        events.append((action.lease_until, "lease_until", "the current claim's lease ends"))
    if action.state is ActionState.ADMITTED:
        events.append((action.available_at, "due", "waits until then to be claimed"))
    if action.ended_at:
        events.append((action.ended_at, "ended", f"{action.state} {action.stop_reason}"))
    events.sort(key=lambda e: e[0])
    return [{"at": at, "event": name, "detail": detail} for at, name, detail in events]


def inspect_operation(schema: str, action_id: int) -> Operation[dict[str, Any] | None]:
    """The action's fields, its lane and its history; None when there is no such row (it never
    existed, was erased, or was pruned)."""
    q = queries_for(schema)
    rows = yield Statement(q["action_by_id"], {"id": action_id})
    if not rows:
        return None
    action = Action.from_row(rows[0])
    lane_rows = yield Statement(q["lane_of_action"], {"id": action.id, "lane_key": action.lane_key})
    lane = lane_rows[0]
    fields = action.as_dict()
    fields.pop("created")
    lease_left = (
        (action.lease_until - lane["db_now"]).total_seconds()
        if action.state is ActionState.EXECUTING and action.lease_until
        else None
    )
    return {
        "action": fields,
        "lane": {
            "lane_key": action.lane_key,
            "head_id": lane["head_id"],
            "executing_id": lane["executing_id"],
            "waiting_before": int(lane["waiting_before"]) if action.state.is_pending else 0,
        },
        "attempts": f"{action.attempt} of {action.max_attempts} (epoch {action.epoch})",
        "lease_left_seconds": lease_left,
        "history": _history(action),
    }


def status(conn: Any, *, schema: str | None = None, latest: int = LATEST) -> StatusReport:
    """The status report, read on ``conn``."""
    return run_sync(
        psycopg_connection(conn, "status"), status_operation(schema or default_schema(), latest)
    )


def inspect(conn: Any, action_id: int, *, schema: str | None = None) -> dict[str, Any] | None:
    """One action as ``outbox inspect`` shows it, or None."""
    op = inspect_operation(schema or default_schema(), action_id)
    return run_sync(psycopg_connection(conn, "inspect"), op)


def disabled_webhook_endpoints(conn: Any, *, schema: str | None = None) -> list[dict[str, Any]]:
    """The disabled webhook subscriptions, each with how many deliveries wait on it."""
    q = queries_for(schema or default_schema())

    def op() -> Operation[list[dict[str, Any]]]:
        rows = yield Statement(q["webhook_subscriptions_disabled"])
        return [dict(r) for r in rows]

    return run_sync(psycopg_connection(conn, "disabled_webhook_endpoints"), op())


def render_disabled_webhook_endpoints(items: list[dict[str, Any]]) -> str:
    """The status section of disabled webhook endpoints (`outbox webhooks enable ID`)."""
    if not items:
        return "disabled webhook endpoints: none"
    lines = ["disabled webhook endpoints (their deliveries wait; `outbox webhooks enable ID`):"]
    for item in items:
        since = item["disabled_at"].isoformat(timespec="seconds") if item["disabled_at"] else "-"
        lines.append(
            f"  #{item['id']} {item['endpoint_url']} {item['disabled_reason'] or '-'} "
            f"(since {since}, {item['consecutive_failures']} failures in a row, "
            f"{item['waiting']} deliveries waiting)"
        )
    return "\n".join(lines)


def json_default(value: Any) -> Any:
    """For ``json.dumps``: times as ISO 8601, durations as seconds."""
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    return str(value)


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, dict | list):
        return json.dumps(value, default=json_default, sort_keys=True)
    return str(json_default(value)) if isinstance(value, datetime | timedelta) else str(value)


def render_status(report: StatusReport) -> str:
    """The human form of ``outbox status``."""
    lines = ["kind                 due  oldest_due_s  in_flight  blocked_lanes  states"]
    stalled: list[str] = []
    for kind in sorted(set(report.counts) | set(report.backlog)):
        b = report.backlog.get(kind, {})
        states = ", ".join(f"{s}={n}" for s, n in sorted(report.counts.get(kind, {}).items()))
        lines.append(
            f"{kind:<20} {b.get('due', 0):>4} {b.get('oldest_due_age', 0.0):>13.1f} "
            f"{b.get('in_flight', 0):>10} {b.get('blocked_lanes', 0):>14}  {states or '-'}"
        )
        if b.get("unconsumed"):
            stalled.append(
                f"  {kind}: {b['unconsumed']} claims were not taken by any worker within their "
                f"lease: is a worker pool consuming queue {b.get('queue', '?')}? Claimers claim "
                "nothing new of this kind meanwhile (no attempt is spent)."
            )
    if stalled:
        lines.append("not consumed:")
        lines.extend(stalled)
    for title, items in (
        ("latest UNCERTAIN", report.latest_uncertain),
        ("latest FAILED", report.latest_failed),
    ):
        lines.append(f"{title}:" if items else f"{title}: none")
        for item in items:
            ended = item["ended_at"].isoformat(timespec="seconds") if item["ended_at"] else "-"
            lines.append(
                f"  #{item['id']} {item['kind']} {item['stop_reason']} "
                f"(attempt {item['attempt']}/{item['max_attempts']}, ended {ended})"
                + (f", last retry: {item['retry_reason']}" if item.get("retry_reason") else "")
            )
    return "\n".join(lines)


def render_inspect(found: dict[str, Any]) -> str:
    """The human form of ``outbox inspect``."""
    action = found["action"]
    lines = [f"action {action['id']}"]
    lines += [f"  {name:<19} {_show(value)}" for name, value in action.items()]
    lane = found["lane"]
    lines.append(
        f"lane {lane['lane_key']}: head {lane['head_id'] or '-'}, executing "
        f"{lane['executing_id'] or '-'}, {lane['waiting_before']} waiting before this one"
    )
    lines.append(f"attempts: {found['attempts']}")
    if found["lease_left_seconds"] is not None:
        lines.append(f"lease left: {found['lease_left_seconds']:.1f}s")
    lines.append("history:")
    lines += [
        f"  {json_default(e['at'])}  {e['event']:<13} {e['detail']}" for e in found["history"]
    ]
    return "\n".join(lines)
