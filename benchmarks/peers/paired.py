"""``inprocess`` and its peer, ``pgqueuer-inprocess``, in turns: when a run has both
(``--peers``), the two drains alternate, ``ROUNDS`` pairs of them (the side that drains first
alternating, so that what one drain leaves the server, dead rows and WAL to write out, falls on
each side alike), and ``inprocess-vs-pgqueuer``'s ratio is the median pair's.

Timed minutes apart, the two drains met different hours of a shared machine: pgqueuer's drain
moved from 6,700 to 18,000 jobs/s between runs and the ratio from 0.41 to 1.03. Side by side,
a slow patch lands on both drains of a pair, and the median pair leaves out the odd one.
"""

from __future__ import annotations

import statistics
from dataclasses import replace

from benchmarks import inprocess
from benchmarks.common import Result, Scale
from benchmarks.peers import pgqueuer_runs
from benchmarks.peers.compare import COMPARISONS, comparison_row

#: Pairs of drains: in a quick run, in a default one.
ROUNDS = (3, 5)
#: The comparison the pairs make.
COMPARISON = next(c for c in COMPARISONS if c.ours == "inprocess")


def run(scale: Scale) -> list[Result]:
    """The median pair's two rows (``inprocess`` with its ceiling, measured once after the
    pairs) and the comparison, its ratio the median of the pairs' ratios; each row lists every
    pair's figure (``rounds_per_s``, ``round_ratios``)."""
    n = inprocess.n_actions(scale)
    pairs: list[tuple[Result, Result]] = []
    for index in range(ROUNDS[0] if scale.quick else ROUNDS[1]):
        if index % 2 == 0:
            ours = inprocess.drain(n)
            peer = pgqueuer_runs.drain(n)
        else:
            peer = pgqueuer_runs.drain(n)
            ours = inprocess.drain(n)
        pairs.append((ours, peer))
    ratios = [(o.actions_per_s or 0.0) / (p.actions_per_s or 1.0) for o, p in pairs]
    ours, peer = pairs[sorted(range(len(pairs)), key=ratios.__getitem__)[len(pairs) // 2]]
    ours = inprocess.with_ceiling(ours, inprocess.ceiling(scale, ours))
    ours = _with_rounds(ours, [o.actions_per_s for o, _ in pairs])
    peer = _with_rounds(peer, [p.actions_per_s for _, p in pairs])
    compared = comparison_row(COMPARISON, ours, peer)
    compared = replace(
        compared,
        ratio=round(statistics.median(ratios), 3),
        extra={**compared.extra, "round_ratios": [round(r, 3) for r in ratios]},
    )
    return [ours, peer, compared]


def _with_rounds(row: Result, rates: list[float | None]) -> Result:
    return replace(row, extra={**row.extra, "rounds_per_s": rates})
