"""``enqueue-concurrent``: many application processes enqueue at once, one action a transaction
each, against the same processes inserting into a plain table (``enqueue``'s ``PLAIN``).

Every enqueue's transaction sends a NOTIFY (the insert trigger's wake-up for the claimer), and
PostgreSQL serializes the commits of notifying transactions: each takes one lock (on "database
0") before its commit record and holds it until the commit is flushed, so that notifications
reach listeners in commit order. Concurrent enqueuers then commit one after the other instead of
sharing WAL flushes. A third side, the plain insert plus the same NOTIFY in its transaction,
measures what that alone costs (``notify_ceiling_ratio``), apart from the outbox's other
bookkeeping; a fourth, the enqueue on connections with ``outbox.enqueue_notify = off``
(migration 0027), what turning it off gives back (``quiet_per_s``, ``quiet_ratio``).

The four sides take turns (``TURNS``, the first side rotating), each turn a fixed time with
every process writing as fast as it can; a side's rate is its writes over its turns' time.
"""

from __future__ import annotations

import multiprocessing
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg.types.json import Jsonb

from benchmarks.common import DATABASE_URL, NOOP, Result, Scale, ms, noop_request, percentile

#: Application processes writing at once (a web tier's workers, say): enough to queue on the
#: NOTIFY lock on two cores.
CLIENTS = 16
#: Turns of each side.
TURNS = 3
#: The channel of the plain side's NOTIFY: nobody listens to it, as nobody listens to the
#: outbox's during this scenario (PostgreSQL queues a notification whether or not anyone listens).
PLAIN_CHANNEL = "outbox_bench_plain"
#: The sides, in the order of the first turn.
SIDES = ("plain", "plain-notify", "outbox", "outbox-quiet")


#: One transaction's write (its commit is the caller's), given the row's key.
Write = Callable[[psycopg.Connection[Any], str], None]


def writer(side: str, schema: str, insert_plain: str) -> Write:
    """``side``'s write."""
    from outbox import enqueue

    def outbox_write(conn: psycopg.Connection[Any], key: str) -> None:
        enqueue(conn, noop_request(key), schema=schema)

    def plain_write(conn: psycopg.Connection[Any], key: str) -> None:
        conn.execute(insert_plain, (NOOP.name, "w", key, key, Jsonb({"i": 0})))

    def plain_notify_write(conn: psycopg.Connection[Any], key: str) -> None:
        plain_write(conn, key)
        conn.execute("SELECT pg_notify(%s, '')", (PLAIN_CHANNEL,))

    return {
        "outbox": outbox_write,
        "outbox-quiet": outbox_write,
        "plain": plain_write,
        "plain-notify": plain_notify_write,
    }[side]


def _client(args: tuple[str, str, str, str, float, float]) -> list[float]:
    """One process's turn: writes from ``start`` to ``end`` (wall clock), one a transaction;
    returns each transaction's seconds (its write and commit)."""
    side, schema, insert_plain, tag, start, end = args
    write = writer(side, schema, insert_plain)
    latencies: list[float] = []
    # As an application would turn it off for its role or database (ALTER ROLE ... SET).
    options = "-c outbox.enqueue_notify=off" if side == "outbox-quiet" else ""
    with psycopg.connect(DATABASE_URL, options=options) as conn:
        write(conn, f"{tag}-warm")  # the connection's first statements, before the clock
        conn.commit()
        while time.time() < start:
            time.sleep(0.001)
        while time.time() < end:
            began = time.perf_counter()
            write(conn, f"{tag}-{len(latencies)}")
            conn.commit()
            latencies.append(time.perf_counter() - began)
    return latencies


def _ready(ready: Any) -> None:
    """A pool process imports what its turns use, then says so on ``ready`` (a queue): the
    first turn starts once every process has (a process spawned on two cores beside fifteen
    others takes a second or more)."""
    import outbox  # noqa: F401

    ready.put(True)


def run(scale: Scale, schema: str, insert_plain: str) -> Result:
    """The four sides in turns, in ``schema`` (migrated, with ``enqueue``'s plain table)."""
    seconds = scale.seconds(2.0, 5.0)
    latencies: dict[str, list[float]] = {side: [] for side in SIDES}
    spent = dict.fromkeys(SIDES, 0.0)
    context = multiprocessing.get_context("spawn")
    ready = context.Queue()
    with context.Pool(CLIENTS, initializer=_ready, initargs=(ready,)) as pool:
        for _ in range(CLIENTS):
            ready.get(timeout=120)
        for turn in range(TURNS):
            order = SIDES[turn % len(SIDES) :] + SIDES[: turn % len(SIDES)]
            for side in order:
                # The processes start together, a moment after they are handed the turn.
                start = time.time() + 0.5
                end = start + seconds
                tag = f"{side}-{turn}"
                jobs = [
                    (side, schema, insert_plain, f"{tag}-{c}", start, end) for c in range(CLIENTS)
                ]
                for part in pool.map(_client, jobs, chunksize=1):
                    latencies[side].extend(part)
                spent[side] += seconds
    rate = {side: len(latencies[side]) / spent[side] for side in SIDES}
    ours = latencies["outbox"]
    return Result(
        scenario="enqueue-concurrent",
        n=len(ours),
        actions_per_s=round(rate["outbox"], 1),
        p50_ms=ms(percentile(ours, 50)),
        p99_ms=ms(percentile(ours, 99)),
        ratio=round(rate["outbox"] / rate["plain"], 3),
        ratio_to="plain-insert-concurrent",
        extra={
            "clients": CLIENTS,
            "per_transaction": 1,
            "latency_is": "one transaction (its enqueue and commit), under the clients' load",
            "ceiling_per_s": round(rate["plain"], 1),
            "ceiling_p50_ms": ms(percentile(latencies["plain"], 50)),
            "notify_ceiling_per_s": round(rate["plain-notify"], 1),
            "notify_ceiling_p50_ms": ms(percentile(latencies["plain-notify"], 50)),
            "notify_ceiling_ratio": round(rate["plain-notify"] / rate["plain"], 3),
            "quiet_per_s": round(rate["outbox-quiet"], 1),
            "quiet_p50_ms": ms(percentile(latencies["outbox-quiet"], 50)),
            "quiet_ratio": round(rate["outbox-quiet"] / rate["plain"], 3),
        },
    )
