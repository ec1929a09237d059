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
from outbox.operator.pausing import paused_kinds_operation
from outbox.operator.processes import LIVE_INTERVALS, live_processes_operation
from outbox.operator.reading import record_operation
from outbox.operator.records import AttemptRecord
from outbox.provider_outage import (
    DEFAULT_RULE,
    MAX_THRESHOLD,
    OutageRule,
)
from outbox.queries import queries_for
from outbox.state import ActionState
from outbox.vacuum_horizon import describe_holder, horizon_holders_operation, listing_rule

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
    #: Kinds an operator paused (kind, paused_by, paused_at, note).
    paused: list[dict[str, Any]] = field(default_factory=list)
    #: Claimer and worker processes whose heartbeat is recent.
    processes: list[dict[str, Any]] = field(default_factory=list)
    #: The roles and databases whose enqueues send no NOTIFY (``outbox.enqueue_notify`` off:
    #: role and database, None for every one), whose actions claimers find at their poll.
    enqueue_notify_off: list[dict[str, Any]] = field(default_factory=list)
    #: What has held the database's vacuum horizon back for over ``HELD_TOO_LONG`` (sessions
    #: and prepared transactions, the longest first; then replication slots and replicas
    #: ``HELD_TOO_MANY_XIDS`` transactions back, and inactive slots): claims slow down until
    #: they end.
    vacuum_horizon: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def status_operation(
    schema: str, latest: int = LATEST, live_within: timedelta = timedelta(seconds=15)
) -> Operation[StatusReport]:
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
        paused=[p.as_dict() for p in (yield from paused_kinds_operation(schema))],
        processes=[p.as_dict() for p in (yield from live_processes_operation(schema, live_within))],
        enqueue_notify_off=(yield from enqueue_notify_off_operation(schema)),
        vacuum_horizon=(yield from horizon_holders_operation(schema)),
    )


def enqueue_notify_off_operation(schema: str) -> Operation[list[dict[str, Any]]]:
    """The role and database defaults that turn the enqueue's NOTIFY off for this database
    (``enqueue_notify_off`` in ``queries.sql``)."""
    rows = yield Statement(queries_for(schema)["enqueue_notify_off"])
    return [dict(r) for r in rows]


def describe_enqueue_notify_off(settings: list[dict[str, Any]]) -> str | None:
    """Who enqueues without a NOTIFY, in words (None: everyone notifies)."""
    if not settings:
        return None
    who = [
        (f"role {s['role']}" if s["role"] else "every role")
        + (" in this database" if s["database"] else " in every database")
        for s in settings
    ]
    return (
        f"enqueues send no NOTIFY (outbox.enqueue_notify=off) for {'; '.join(who)}: claimers "
        "find their actions at their poll (OUTBOX_POLL_INTERVAL_SECONDS)"
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
    record = yield from record_operation(schema, action_id)
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
        # The heartbeat process id of the claimer that made its latest claim (None in process),
        # which `outbox status` lists while it lives.
        "claimed_by": rows[0].get("claimed_by"),
        # The worker process whose take runs the latest claim (None until a worker took it, and
        # in process).
        "taken_by": rows[0].get("taken_by"),
        "history": _history(action),
        # The attempts on record, each with its provider reference (an email's Message-ID).
        "attempt_history": [a.as_dict() for a in record.attempts],
        "provider_ref": _provider_ref(action, record.attempts),
        "resolution": record.resolution.as_dict() if record.resolution else None,
        "made_from": [link.as_dict() for link in record.earlier],
        "followed_by": [link.as_dict() for link in record.later],
        "payload_parked": record.payload_parked,
    }


def _provider_ref(action: Action, attempts: list[AttemptRecord]) -> str | None:
    """The provider's reference: the DONE one, else the latest an attempt recorded."""
    if action.readback_ref:
        return action.readback_ref
    refs = [a.provider_ref for a in attempts if a.provider_ref]
    return refs[-1] if refs else None


def status(conn: Any, *, schema: str | None = None, latest: int = LATEST) -> StatusReport:
    """The status report, read on ``conn``."""
    from outbox.config import Settings

    live = Settings.from_env().heartbeat_interval * LIVE_INTERVALS
    return run_sync(
        psycopg_connection(conn, "status"),
        status_operation(schema or default_schema(), latest, live),
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


def _hold_text(backlog: dict[str, Any]) -> str:
    if backlog.get("held_for"):
        return f"; claims hold it for another {backlog['held_for']:.0f}s"
    if backlog.get("holds"):
        return "; its hold is over: one action at a time probes the provider"
    return ""


def render_status(report: StatusReport, outage_rule: OutageRule = DEFAULT_RULE) -> str:
    """The human form of ``outbox status``; ``outage_rule`` as ``Settings.outage_rule`` (whether
    a retrying provider counts as down, as the executor decides)."""
    lines = ["kind                 due  oldest_due_s  in_flight  blocked_lanes  states"]
    stalled: list[str] = []
    retrying: list[str] = []
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
        if b.get("retrying"):
            retrying_for = b.get("retrying_for", 0.0)
            consequence = outage_rule.verdict(b["retrying"], retrying_for).consequence
            retrying.append(
                f"  {kind}: {b['retrying']}{'+' if b['retrying'] >= MAX_THRESHOLD else ''} "
                f"actions answered Retry since its last DONE, the first {retrying_for:.0f}s ago"
                + (f": {consequence}" if consequence else "")
                + _hold_text(b)
            )
    if stalled:
        lines.append("not consumed:")
        lines.extend(stalled)
    if retrying:
        lines.append("retrying providers (docs/operations.md, A provider outage):")
        lines.extend(retrying)
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
                + (f", ref {item['provider_ref']}" if item.get("provider_ref") else "")
                + (
                    f", resolved {item['resolution']} by {item['resolved_by']}"
                    if item.get("resolution")
                    else ""
                )
            )
    if report.paused:
        lines.append("paused kinds (`outbox resume KIND`):")
        for p in report.paused:
            lines.append(
                f"  {p['kind']} by {p['paused_by']} since "
                f"{p['paused_at'].isoformat(timespec='seconds')}"
                + (f": {p['note']}" if p.get("note") else "")
            )
    else:
        lines.append("paused kinds: none")
    lines.append(
        describe_enqueue_notify_off(report.enqueue_notify_off)
        or "enqueue NOTIFY: on (claimers wake at each enqueue's commit)"
    )
    if report.vacuum_horizon:
        lines.append(
            "vacuum horizon held back (vacuum removes no dead rows and claims slow down until "
            "these end; docs/operations.md, A long transaction elsewhere):"
        )
        lines.extend(f"  {describe_holder(holder)}" for holder in report.vacuum_horizon)
    else:
        lines.append(f"vacuum horizon: nothing seen holding it for {listing_rule()}")
    lines.append("live processes:" if report.processes else "live processes: none")
    for p in report.processes:
        lines.append(
            f"  {p['role']:<7} {p['host']} pid {p['pid']} in flight {p['in_flight']}, "
            f"last seen {p['age']:.1f}s ago, up since "
            f"{p['started_at'].isoformat(timespec='seconds')} ({', '.join(p['kinds']) or '-'})"
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
    if found.get("claimed_by"):
        lines.append(f"claimed by: {found['claimed_by']}")
    if found.get("taken_by"):
        lines.append(f"taken by: {found['taken_by']}")
    lines.append("history:")
    lines += [
        f"  {json_default(e['at'])}  {e['event']:<13} {e['detail']}" for e in found["history"]
    ]
    lines.append(f"provider reference: {found.get('provider_ref') or '-'}")
    attempts = found.get("attempt_history") or []
    lines.append("attempts on record:" if attempts else "attempts on record: none")
    for a in attempts:
        result = a["result"] or ("LOST (lease ran out)" if a["lost"] else "running")
        lines.append(
            f"  #{a['attempt']} epoch {a['epoch']}: taken {json_default(a['taken_at'])}, "
            f"fence {json_default(a['fence_passed_at']) if a['fence_passed_at'] else '-'}, "
            f"ended {json_default(a['ended_at']) if a['ended_at'] else '-'}: {result}"
            + (f" {a['reason']}" if a["reason"] else "")
            + (f", error {a['error_class']}" if a["error_class"] else "")
            + (f", ref {a['provider_ref']}" if a["provider_ref"] else "")
        )
    resolution = found.get("resolution")
    if resolution:
        lines.append(
            f"resolved {resolution['outcome']} by {resolution['resolved_by']} at "
            f"{json_default(resolution['resolved_at'])}"
            + (f": {resolution['note']}" if resolution["note"] else "")
        )
    for link in found.get("made_from") or []:
        lines.append(f"a {link['relation']} of action {link['from_id']} (by {link['created_by']})")
    for link in found.get("followed_by") or []:
        lines.append(f"{link['relation']} as action {link['to_id']} (by {link['created_by']})")
    if found.get("payload_parked"):
        lines.append("payload kept for a resend or retry")
    return "\n".join(lines)
