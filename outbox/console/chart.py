"""The outcomes chart: actions ended per minute over the last hour, stacked by final state, as
inline SVG rendered on the server (no script, no CDN)."""

from __future__ import annotations

from markupsafe import Markup, escape

from outbox.console.reads import CHART_STATES

COLOURS = {"DONE": "#2da44e", "CANCELLED": "#8c959f", "FAILED": "#cf222e", "UNCERTAIN": "#bf8700"}
WIDTH, HEIGHT, LEFT, BOTTOM, TOP = 720, 170, 44, 22, 8


def outcomes_svg(minutes: list[dict[str, int]]) -> Markup:
    """One bar a minute (oldest left), each stacked DONE, CANCELLED, FAILED, UNCERTAIN; a
    title on every segment says the minute and the count, for a mouse or a screen reader."""
    totals = [sum(m.values()) for m in minutes]
    peak = max([*totals, 1])
    plot_w, plot_h = WIDTH - LEFT - 6, HEIGHT - BOTTOM - TOP
    slot = plot_w / max(len(minutes), 1)
    parts = [
        f'<svg class="chart" role="img" viewBox="0 0 {WIDTH} {HEIGHT}" width="{WIDTH}" '
        f'height="{HEIGHT}" aria-label="actions ended per minute over the last hour, '
        f'{sum(totals)} in all">',
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{WIDTH - 6}" y2="{TOP + plot_h}" '
        'stroke="#8c959f"/>',
        f'<text x="{LEFT - 6}" y="{TOP + 10}" text-anchor="end" font-size="11">{peak}</text>',
        f'<text x="{LEFT - 6}" y="{TOP + plot_h}" text-anchor="end" font-size="11">0</text>',
    ]
    for i, minute in enumerate(minutes):
        x = LEFT + i * slot + 1
        y = float(TOP + plot_h)
        ago = len(minutes) - 1 - i
        for state in CHART_STATES:
            n = minute.get(state, 0)
            if not n:
                continue
            h = plot_h * n / peak
            y -= h
            label = escape(f"{ago} min ago: {n} {state}")
            parts.append(
                f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(slot - 2, 1):.1f}" height="{h:.1f}" '
                f'fill="{COLOURS[state]}"><title>{label}</title></rect>'
            )
    for ago in (60, 45, 30, 15, 0):
        i = len(minutes) - 1 - min(ago, len(minutes) - 1)
        x = LEFT + i * slot + slot / 2
        text = "now" if ago == 0 else f"-{ago}m"
        parts.append(
            f'<text x="{x:.1f}" y="{HEIGHT - 6}" text-anchor="middle" font-size="11">{text}</text>'
        )
    parts.append("</svg>")
    legend = "".join(
        f'<span class="swatch"><svg width="10" height="10" aria-hidden="true"><rect width="10" '
        f'height="10" fill="{COLOURS[s]}"/></svg> {s}</span>'
        for s in CHART_STATES
    )
    return Markup("".join(parts) + f'<div class="legend">{legend}</div>')
