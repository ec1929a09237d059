"""Rows that compare an outbox scenario with its peer when both ran in the same run:
``<ours>-vs-<peer>``, carrying our row's numbers and ``ratio`` = ours over the peer's (actions/s
for throughput, p50 for latency, the CPU in all for idle processes: above 1 the outbox is
faster, resp. slower, resp. costs more)."""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.common import Result


@dataclass(frozen=True)
class Comparison:
    ours: str
    peer: str
    #: "throughput" (actions/s), "latency" (p50) or "idle" (``total_cpu_pct``).
    measure: str

    @property
    def name(self) -> str:
        return f"{self.ours}-vs-{self.peer.split('-', 1)[0]}"


COMPARISONS = (
    Comparison("inprocess", "pgqueuer-inprocess", "throughput"),
    Comparison("latency", "pgqueuer-latency", "latency"),
    Comparison("latency", "procrastinate-latency", "latency"),
    Comparison("lanes-50", "procrastinate-lanes-50", "throughput"),
    Comparison("lanes-1000", "procrastinate-lanes-1000", "throughput"),
    Comparison("idle", "pgqueuer-idle", "idle"),
    Comparison("idle", "procrastinate-idle", "idle"),
    Comparison("horizon", "pgqueuer-horizon", "throughput"),
)


#: The CPU an action each side reports, when both do (``inprocess`` and its peer).
CPU_KEYS = ("client_cpu_ms_per_action", "postgres_cpu_ms_per_action", "total_cpu_ms_per_action")


def _cpu_ratios(ours: Result, peer: Result) -> dict[str, float | None]:
    """Per CPU key both rows carry: the peer's figure and ours over it (``<key>_ratio``: above
    1, the outbox spends more CPU an action)."""
    row: dict[str, float | None] = {}
    for key in CPU_KEYS:
        mine, theirs = ours.extra.get(key), peer.extra.get(key)
        if isinstance(mine, float | int) and isinstance(theirs, float | int) and theirs:
            row[f"peer_{key}"] = theirs
            row[f"{key.removesuffix('_per_action')}_ratio"] = round(mine / theirs, 3)
    return row


def comparison_row(comparison: Comparison, ours: Result, peer: Result) -> Result:
    """The ``<ours>-vs-<peer>`` row of two rows of the same run."""
    if comparison.measure == "throughput":
        mine, theirs = ours.actions_per_s, peer.actions_per_s
        extra = {"peer_per_s": theirs, **_cpu_ratios(ours, peer)}
    elif comparison.measure == "idle":
        mine, theirs = ours.extra.get("total_cpu_pct"), peer.extra.get("total_cpu_pct")
        extra = {
            "total_cpu_pct": mine,
            "peer_total_cpu_pct": theirs,
            "pg_xacts_per_s": ours.extra.get("pg_xacts_per_s"),
            "peer_pg_xacts_per_s": peer.extra.get("pg_xacts_per_s"),
        }
    else:
        mine, theirs = ours.p50_ms, peer.p50_ms
        p99 = ours.p99_ms / peer.p99_ms if ours.p99_ms and peer.p99_ms else None
        extra = {
            "peer_p50_ms": theirs,
            "peer_p99_ms": peer.p99_ms,
            "p99_ratio": round(p99, 3) if p99 is not None else None,
        }
    return Result(
        scenario=comparison.name,
        n=ours.n,
        actions_per_s=ours.actions_per_s,
        p50_ms=ours.p50_ms,
        p99_ms=ours.p99_ms,
        ratio=round(mine / theirs, 3) if mine and theirs else None,
        ratio_to=peer.scenario,
        extra={"measure": comparison.measure, "peer_n": peer.n, **extra},
    )


def new_rows(results: list[Result], emitted: set[str]) -> list[Result]:
    """The comparisons both of whose rows are in ``results`` and neither in ``emitted`` (which
    this adds them to) nor in ``results`` already (a scenario that ran in turns with its peer
    made its own, ``benchmarks.peers.paired``)."""
    by_name = {r.scenario: r for r in results}
    rows = []
    for comparison in COMPARISONS:
        ours, peer = by_name.get(comparison.ours), by_name.get(comparison.peer)
        if ours and peer and comparison.name not in emitted and comparison.name not in by_name:
            emitted.add(comparison.name)
            rows.append(comparison_row(comparison, ours, peer))
    return rows
