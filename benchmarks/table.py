"""The readable table: one row per result, in Markdown so it pastes into the README."""

from __future__ import annotations

from benchmarks.common import Result

COLUMNS = ("scenario", "n", "actions/s", "p50 ms", "p99 ms", "ratio", "ratio to")


def _cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if abs(value) < 10:
            return f"{value:.3f}"
        return f"{value:,.1f}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def render(results: list[Result]) -> str:
    rows = [COLUMNS] + [
        tuple(
            _cell(v)
            for v in (r.scenario, r.n, r.actions_per_s, r.p50_ms, r.p99_ms, r.ratio, r.ratio_to)
        )
        for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(COLUMNS))]
    lines = [
        "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) + " |"
        for row in rows
    ]
    lines.insert(1, "| " + " | ".join("-" * w for w in widths) + " |")
    return "\n".join(lines)
