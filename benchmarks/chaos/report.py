"""The soak's closing table: each check with its count and verdict, then what happened."""

from __future__ import annotations

from collections import Counter
from typing import Any

from benchmarks.chaos.checks import (
    READ_BACK,
    Check,
    Evidence,
    ended_after_a_write,
    restart_explains,
)


def happenings(ev: Evidence, caused: dict[int, int], aimed_hits: int) -> list[tuple[str, Any]]:
    """The numbers that say the soak exercised what it claims to: kills, kills inside the
    fence-to-finish window, retries from injected faults, reclaims, erasures, expiries, and each
    server restart and worker-pool outage with how long it lasted."""
    killed = {e["pgid"]: e for e in ev.ends if e["how"] == "SIGKILL"}
    roles = Counter(e["role"] for e in killed.values())
    cut = [a for a in ev.attempts if a["stopped_at"] is None and a["pgid"] in killed]
    after_fence = [a for a in cut if a["fence_asked_at"] is not None]
    # Killed after the adapter returned and before its finish was written (the result is lost).
    unfinished = {
        (a["id"], a["epoch"])
        for a in ev.actions.values()
        if a["stop_reason"] in ("LEASE_LOST_AFTER_WRITE",)
    }
    returned = [
        a
        for a in ev.attempts
        if a["stopped_at"] is not None and (a["action_id"], a["epoch"]) in unfinished
    ]
    states = Counter(
        (ev.enqueued[i]["kind"], a["state"], a["stop_reason"]) for i, a in ev.actions.items()
    )
    email_retries = sum(1 for a in ev.attempts if a["kind"] == "EMAIL" and a["result"] == "Retry")
    planned = Counter(e["fault"] for e in ev.enqueued.values() if e["kind"] in READ_BACK)
    http = " / ".join(f"{planned[f]}/{ev.http_faults[f]}" for f in ("e", "x", "t", "r"))
    resends = sum(sum(ids.values()) - len(ids) for ids in ev.deliveries.values())
    rows: list[tuple[str, Any]] = [
        ("actions enqueued", len(ev.enqueued)),
        ("lanes", len({e["lane"] for e in ev.enqueued.values()})),
        ("attempts recorded", len(ev.attempts)),
        ("SIGKILLs (claimer / worker)", f"{roles['claimer']} / {roles['worker']}"),
        ("  aimed at an email past its fence", aimed_hits),
        ("attempts cut by a kill", len(cut)),
        ("  of them after the fence", len(after_fence)),
        ("kills between the adapter's return and its finish", len(returned)),
        (
            "attempts after a write started (read back)",
            sum(1 for a in ev.attempts if a["write_started"]),
        ),
        ("HTTP faults planned/met: 500 after write / reset / slow / 429", http),
        ("webhook resends of a taken webhook-id", resends),
        (
            "read-back actions ended FAILED/CANCELLED after a write began",
            sum(
                1
                for i, e in ev.enqueued.items()
                if e["kind"] in READ_BACK and ended_after_a_write(ev.actions.get(i))
            ),
        ),
        ("email attempts retried (SMTP 4xx)", email_retries),
        ("UNCERTAIN, each with its kill", len(caused)),
        ("distinct kills that caused an UNCERTAIN", len(set(caused.values()))),
        (
            "UNCERTAIN after a database restart, no kill",
            sum(
                1
                for a in ev.actions.values()
                if a["state"] == "UNCERTAIN" and a["id"] not in caused and restart_explains(ev, a)
            ),
        ),
        ("takes by workers (= attempts spent)", sum(ev.takes.values())),
        (
            "accounts erased / actions erased",
            f"{len(ev.erasures)} / {sum(e['erased'] for e in ev.erasures)}",
        ),
        ("  erased while EXECUTING", sum(e["in_flight"] for e in ev.erasures)),
    ]
    for fault in ev.faults:
        seconds = (fault["after"] - fault["before"]).total_seconds()
        rows.append((f"fault: {fault['name']}", f"{seconds:.1f} s"))
    for (kind, state, reason), n in sorted(states.items()):
        rows.append((f"{kind} {state} {reason}", n))
    return rows


def render(checks: list[Check], rows: list[tuple[str, Any]], seconds: float) -> str:
    width = max(len(c.name) for c in checks) + 2
    lines = [f"{'check':<{width}} {'examined':>9}  result", "-" * (width + 20)]
    for c in checks:
        verdict = "ok" if c.ok else f"FAILED ({len(c.violations)})"
        if c.excused:
            verdict += f", {len(c.excused)} excused"
        lines.append(f"{c.name:<{width}} {c.examined:>9}  {verdict}")
    lines.append("")
    label = max(len(k) for k, _ in rows) + 2
    for key, value in rows:
        lines.append(f"{key:<{label}} {value}")
    lines.append(f"{'wall clock':<{label}} {seconds:.0f} s")
    for c in checks:
        for v in c.violations[:10]:
            lines.append(f"! {c.name}: {v}")
        for v in c.excused[:10]:
            lines.append(f"~ {c.name}: {v}")
    return "\n".join(lines)
