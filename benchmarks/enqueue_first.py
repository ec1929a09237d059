"""``enqueue-first``: the first ``outbox.enqueue`` on a new connection, against the first plain
insert (``enqueue``'s ``PLAIN``) on a new connection.

An application that opens a connection for each request (Django's default ``CONN_MAX_AGE = 0``, a
script, a serverless function) runs each enqueue on a fresh PostgreSQL backend, which loads the
catalog entries of every table, index and function the statement touches and compiles the insert
trigger before it can run it; a pooled connection pays that once. Each round opens one connection
for each side (the side that goes first alternating), runs ``SELECT 1`` on it (the connection's
own setup and first round trip are left out), then times one write and its commit, and a second
write and its commit on the same connection (what every later one costs).

``ratio`` is the plain insert's median first write over the enqueue's (as for a rate, 1.0 would
be as fast as the plain insert); ``second_p50_ms`` is the enqueue's median second write.
"""

from __future__ import annotations

import time

import psycopg

from benchmarks.common import DATABASE_URL, Result, Scale, median, ms, percentile
from benchmarks.enqueue_concurrent import Write, writer

#: The two sides, in the order of the first round.
SIDES = ("plain", "outbox")


class _Side:
    """One side's timings: the connection's setup, its first write and its second."""

    def __init__(self, write: Write) -> None:
        self.write = write
        self.connects: list[float] = []
        self.firsts: list[float] = []
        self.seconds: list[float] = []

    def round(self, key: str) -> None:
        started = time.perf_counter()
        with psycopg.connect(DATABASE_URL) as conn:
            conn.execute("SELECT 1")
            conn.commit()
            self.connects.append(time.perf_counter() - started)
            for times, suffix in ((self.firsts, "a"), (self.seconds, "b")):
                started = time.perf_counter()
                self.write(conn, f"{key}-{suffix}")
                conn.commit()
                times.append(time.perf_counter() - started)


def run(scale: Scale, schema: str, insert_plain: str) -> Result:
    """``enqueue-first`` on ``schema`` (migrated, the no-op kind declared, ``PLAIN`` made)."""
    rounds = scale.n(100, 300, floor=6)
    sides = {name: _Side(writer(name, schema, insert_plain)) for name in SIDES}
    order = list(sides.items())
    for index in range(rounds):
        for name, side in order if index % 2 == 0 else reversed(order):
            side.round(f"first-{name}-{index}")
    outbox, plain = sides["outbox"], sides["plain"]
    return Result(
        scenario="enqueue-first",
        n=rounds,
        actions_per_s=round(rounds / sum(outbox.firsts), 1),
        p50_ms=ms(median(outbox.firsts)),
        p99_ms=ms(percentile(outbox.firsts, 99)),
        ratio=round(median(plain.firsts) / median(outbox.firsts), 3),
        ratio_to="plain-insert-first",
        extra={
            "latency_is": "a new connection's first write and its commit",
            "second_p50_ms": ms(median(outbox.seconds)),
            "ceiling_p50_ms": ms(median(plain.firsts)),
            "ceiling_p99_ms": ms(percentile(plain.firsts, 99)),
            "ceiling_second_p50_ms": ms(median(plain.seconds)),
            "connect_p50_ms": ms(median(outbox.connects + plain.connects)),
        },
    )
