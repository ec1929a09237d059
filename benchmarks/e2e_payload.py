"""``payload``: ``e2e`` with a payload of 8 KiB an action (the text of an email, say), against
raw Dramatiq carrying the same text in each message (``dramatiq-raw-payload``).

The two move the text differently. The outbox writes it once into PostgreSQL with the enqueue
(a TOASTed, compressed jsonb value, and its WAL), reads it once with the worker's take, and pushes
only ``(id, epoch)`` through the broker; raw Dramatiq sends it through Redis in the message and
each worker decodes it from there. Paired rounds as in ``e2e`` (the raw pool, then the outbox,
a fresh pool each), ``ratio`` the median round's; the outbox enqueues with ``enqueue_many``, 100
a transaction, as ``e2e`` does.
"""

from __future__ import annotations

import random
from functools import cache

from benchmarks import dramatiq_raw
from benchmarks.common import Result, Scale
from benchmarks.e2e import PER_TX, result, run_once

#: The text an action carries, in bytes (UTF-8, ASCII words).
BODY_BYTES = 8 * 1024
#: Distinct texts, taken in turn: each one made once, so that making them costs the run nothing.
BODIES = 64
#: Paired rounds of a quick and of a default run.
ROUNDS = (1, 3)
#: Words of an ordinary English text: it compresses as mail does (a payload's 8.2 KB of JSON is
#: stored in 5.0 KB with lz4, 3.6 KB with pglz), where random bytes would not compress at all
#: and a repeated letter would vanish.
_TEXT = (
    "the of and to in is you that it he was for on are as with his they at be this have from "
    "or one had by word but not what all were we when your can said there use an each which "
    "she do how their if will up other about out many then them these so some her would make "
    "like him into time has look two more write go see number no way could people my than "
    "first water been call who oil its now find long down day did get come made may part order "
    "invoice shipped account payment receipt thanks regards please confirm delivery address"
)
_WORDS = _TEXT.split()


@cache
def _bodies() -> list[str]:
    made = []
    for seed in range(BODIES):
        pick = random.Random(seed)
        words: list[str] = []
        size = 0
        while size < BODY_BYTES:
            word = pick.choice(_WORDS)
            words.append(word)
            size += len(word) + 1
        made.append(" ".join(words)[:BODY_BYTES])
    return made


def body(i: int) -> str:
    """The text of the ``i``-th action or message."""
    return _bodies()[i % BODIES]


def run(scale: Scale) -> list[Result]:
    n = scale.n(3_000, 15_000, floor=50)
    pairs = []
    for _ in range(scale.n(*ROUNDS)):
        raw = dramatiq_raw.throughput(n, body=body)
        pairs.append((raw, run_once(n, raw.per_s, many=True, body=body)))
    e2e = result(
        "e2e-payload",
        [run for _, run in pairs],
        f"enqueue_many, {PER_TX} a transaction",
        "dramatiq-raw-payload",
    )
    e2e.extra["body_bytes"] = BODY_BYTES
    raw, _ = sorted(pairs, key=lambda pair: pair[1].ratio)[len(pairs) // 2]
    ceiling = Result(
        scenario="dramatiq-raw-payload",
        n=n,
        actions_per_s=round(raw.per_s, 1),
        p50_ms=None,
        p99_ms=None,
        ratio=1.0,
        ratio_to="dramatiq-raw-payload",
        extra={"body_bytes": BODY_BYTES, **raw.cpu_ms},
    )
    return [ceiling, e2e]
