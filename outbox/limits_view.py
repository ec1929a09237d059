"""What the limits do right now, for ``outbox status``, the metrics and the console: each kind's
configured limits, its waiting actions (scheduled, backing off, deferred) and how many of them
wait for a rate limit's slot, each rate bucket's next free slot and any provider's pause, and
the limit keys with the most executing actions (what the per-key caps count).

``limits_view(conn, kind_limits)`` (sync) and ``limits_view_async`` are the calls a console
makes; ``Outbox.kind_limits()`` gives the configured limits.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import datetime
from typing import Any

from outbox._io import Operation, Statement, psycopg_connection, run_async, run_sync
from outbox.enqueuing import default_schema
from outbox.limits import BUCKET_SEPARATOR, KindLimits
from outbox.queries import queries_for

#: Most rate buckets and limit keys the view lists (keys come and go: a bucket a key).
VIEW_ROWS = 50


@dataclass(frozen=True, slots=True)
class KindWaits:
    """One kind: its limits (None: unlimited), the admitted actions not yet due, how many of
    them a rate limit deferred, and when the next one is due."""

    kind: str
    limits: dict[str, Any] | None = None
    waiting: int = 0
    rate_limited: int = 0
    next_due_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LimitsView:
    kinds: dict[str, KindWaits] = field(default_factory=dict)
    #: Rate buckets: kind, limit key ('' for the kind's own), seconds to its next free slot,
    #: and seconds a provider's pause still holds it.
    buckets: list[dict[str, Any]] = field(default_factory=list)
    #: The limit keys with the most executing actions: kind, limit_key, executing, cap.
    busiest_keys: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _limits_dict(limits: KindLimits | None) -> dict[str, Any] | None:
    if limits is None:
        return None
    return {
        "rate": str(limits.rate) if limits.rate else None,
        "key_rate": str(limits.key_rate) if limits.key_rate else None,
        "concurrency": limits.concurrency,
        "key_concurrency": limits.key_concurrency,
    }


def limits_view_operation(
    schema: str, kind_limits: Mapping[str, KindLimits]
) -> Operation[LimitsView]:
    q = queries_for(schema)
    kinds: dict[str, KindWaits] = {
        kind: KindWaits(kind, _limits_dict(limits)) for kind, limits in kind_limits.items()
    }
    for row in (yield Statement(q["waits_by_kind"])):
        kind = row["kind"]
        kinds[kind] = KindWaits(
            kind,
            _limits_dict(kind_limits.get(kind)),
            int(row["waiting"]),
            int(row["rate_limited"]),
            row["next_due_at"],
        )
    buckets = []
    for row in (yield Statement(q["rate_buckets"], {"limit": VIEW_ROWS})):
        kind, _, key = row["bucket"].partition(BUCKET_SEPARATOR)
        buckets.append(
            {
                "kind": kind,
                "limit_key": key,
                "next_slot_in": round(float(row["next_in"]), 3),
                "held_for": round(float(row["held_for"]), 3),
            }
        )
    busiest = []
    for row in (yield Statement(q["executing_by_limit_key"], {"limit": VIEW_ROWS})):
        limits = kind_limits.get(row["kind"])
        busiest.append(
            {
                "kind": row["kind"],
                "limit_key": row["limit_key"],
                "executing": int(row["executing"]),
                "cap": limits.key_concurrency if limits else None,
            }
        )
    return LimitsView(dict(sorted(kinds.items())), buckets, busiest)


def limits_view(
    conn: Any, kind_limits: Mapping[str, KindLimits], *, schema: str | None = None
) -> LimitsView:
    """The limits and the waits they cause, now (a psycopg connection or SQLAlchemy session)."""
    op = limits_view_operation(schema or default_schema(), kind_limits)
    return run_sync(psycopg_connection(conn, "limits_view", "limits_view_async"), op)


async def limits_view_async(
    conn: Any, kind_limits: Mapping[str, KindLimits], *, schema: str | None = None
) -> LimitsView:
    return await run_async(conn, limits_view_operation(schema or default_schema(), kind_limits))


def render_limits(view: LimitsView) -> str:
    """The human form, for ``outbox status``."""
    lines = ["limits and waits:"]
    shown = False
    for item in view.kinds.values():
        if item.limits is None and not item.waiting:
            continue
        shown = True
        configured = ", ".join(f"{k}={v}" for k, v in (item.limits or {}).items() if v) or "none"
        next_due = item.next_due_at.isoformat(timespec="seconds") if item.next_due_at else "-"
        lines.append(
            f"  {item.kind}: limits {configured}; {item.waiting} waiting not yet due "
            f"({item.rate_limited} for a rate limit), next due {next_due}"
        )
    for bucket in view.buckets:
        if bucket["next_slot_in"] or bucket["held_for"]:
            shown = True
            name = bucket["kind"] + (f" key {bucket['limit_key']}" if bucket["limit_key"] else "")
            held = f", held by the provider {bucket['held_for']}s" if bucket["held_for"] else ""
            lines.append(f"  rate {name}: next slot in {bucket['next_slot_in']}s{held}")
    for key in view.busiest_keys:
        if key["cap"] is not None and key["executing"] >= key["cap"]:
            shown = True
            lines.append(
                f"  {key['kind']} key {key['limit_key'] or '-'}: at its cap "
                f"({key['executing']}/{key['cap']} executing)"
            )
    if not shown:
        lines.append("  none")
    return "\n".join(lines)
