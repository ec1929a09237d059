"""``provider-outage-short`` and ``provider-outage-long``: the provider goes down while actions
keep coming, then comes back. What does the outage cost: how many calls go to the provider
while it is down, how many actions it costs (their attempts exhausted, FAILED), and how long
after it is back until every other action has run?

A real ``outbox claimer`` and ``outbox worker`` pool of the common layout; the no-op kind's
adapter answers ``Retry`` (a refused connection: the provider proved it holds nothing) while the
outage lasts (``benchmarks.apps``, ``BENCH_PROVIDER_OUTAGE``), and counts every call. Actions,
one lane each, are enqueued one a transaction at ``RATE`` a second from ``LEAD`` s before the
outage until ``TAIL`` s after it.

Time runs ten times faster than the defaults' (``OUTBOX_RETRY_BASE_SECONDS=0.5`` instead of 5;
max attempts 5, the default): the short outage of 2 s stands for 20 s at the defaults, the long
one of 10 s for 100 s. At the defaults an action's five attempts are spent within 37.5 to 75 s
(the back-off doubles from the base, times a random 0.5 to 1), so an outage longer than that
would fail the actions that met its start, but for the provider outage
(``outbox.provider_outage``): once ``OUTBOX_OUTAGE_THRESHOLD`` (5) distinct actions retried with
no DONE between, an attempt that would exhaust gives its attempt back and waits. The long outage
runs three times: with that and its hold (the default: once the provider counts as down,
claims skip the kind for a hold of 5 s at the defaults, doubling to a minute, so its actions
wait without calling it), with that but no hold (``provider-outage-long-no-hold``,
``OUTBOX_OUTAGE_HOLD_SECONDS=0``: the down provider is called once an action a backoff), and
with it off (``provider-outage-long-off``, ``OUTBOX_OUTAGE_THRESHOLD=0``: every attempt
counts).

``ratio``: the actions that met the outage (called the provider while it was down) and still
ended DONE, over all that met it: 1.0 is an outage that cost no action. ``actions_per_s`` is
the load on the provider while it was down: calls a second. p50/p99: how long after the
provider was back the actions that met the outage ended DONE (the back-off each was in when it
came back).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import psycopg
import redis

from benchmarks.apps import OUTAGE_CALLS_KEY, OUTAGE_KEY, PROVIDER_DOWN
from benchmarks.common import (
    DATABASE_URL,
    REDIS_URL,
    Result,
    Scale,
    all_ended,
    bench_schema,
    migrated_outbox,
    ms,
    noop_request,
    percentile,
)
from benchmarks.rig import paced, rig, wait_until

#: The retry base here, and how much faster than the default's (5 s) time runs.
RETRY_BASE_S = 0.5
TIME_SCALE = 10
#: ``OUTBOX_OUTAGE_HOLD_SECONDS``: the default's (5 s) in this scenario's time.
HOLD_S = 0.5
#: The outages, in seconds of this scenario's time (x10 at the default retry base), the
#: actions' max attempts (the default's), ``OUTBOX_OUTAGE_THRESHOLD`` (the default's, then off)
#: and ``OUTBOX_OUTAGE_HOLD_SECONDS`` (the default's, then none).
OUTAGES = {
    "provider-outage-short": (2.0, 5, 5, HOLD_S),
    "provider-outage-long": (10.0, 5, 5, HOLD_S),
    "provider-outage-long-no-hold": (10.0, 5, 5, 0.0),
    "provider-outage-long-off": (10.0, 5, 0, HOLD_S),
}
#: Actions a second, enqueued from ``LEAD`` s before the outage to ``TAIL`` s after it.
RATE = 50
LEAD = 1.0
TAIL = 1.0
#: Below this ``--scale`` only the short outage runs.
TINY = 0.1


def _ended_after(conn: psycopg.Connection[Any], schema: str, back: float) -> dict[str, Any]:
    """What the actions that met the outage came to: per state, and how long after ``back``
    (epoch seconds, the database clock) each that ended DONE ended."""
    met = f'SELECT DISTINCT action_id FROM "{schema}".agent_action_attempt WHERE reason = %s'
    rows = conn.execute(
        "SELECT a.state, extract(epoch FROM a.ended_at)::float8 - %s"
        f' FROM "{schema}".agent_action a WHERE a.id IN ({met})',
        (back, PROVIDER_DOWN),
    ).fetchall()
    states: dict[str, int] = {}
    for state, _ in rows:
        states[state] = states.get(state, 0) + 1
    return {"states": states, "done_after": [after for state, after in rows if state == "DONE"]}


def run_outage(
    scale: Scale, name: str, outage: float, max_attempts: int, threshold: int, hold: float
) -> Result:
    settings = {
        "OUTBOX_RETRY_BASE_SECONDS": str(RETRY_BASE_S),
        "OUTBOX_OUTAGE_THRESHOLD": str(threshold),
        "OUTBOX_OUTAGE_HOLD_SECONDS": str(hold),
        "BENCH_PROVIDER_OUTAGE": "1",
    }
    n = int((LEAD + outage + TAIL) * RATE)
    client = redis.Redis.from_url(REDIS_URL)
    with bench_schema(name) as schema, rig(schema, **settings) as r:
        outbox = migrated_outbox(schema)
        r.outbox_workers()
        r.claimer()
        with (
            psycopg.connect(DATABASE_URL) as conn,
            psycopg.connect(DATABASE_URL, autocommit=True) as watch,
        ):
            went_down = LEAD * RATE
            came_back = (LEAD + outage) * RATE
            back = 0.0
            for i in paced(n, RATE):
                if i == went_down:
                    client.set(OUTAGE_KEY, "1")
                if i == came_back:
                    client.delete(OUTAGE_KEY)
                    back = _db_now(watch)
                request = noop_request(f"outage-{i}", f"lane-{i}", i)
                outbox.enqueue(conn, replace(request, max_attempts=max_attempts))
                conn.commit()
            wait_until(lambda: all_ended(watch, schema), 600, f"{name}: not ended", 0.05)
            drained = _db_now(watch)
            outcome = _ended_after(watch, schema, back)
            states = dict(
                watch.execute(
                    f'SELECT state, count(*) FROM "{schema}".agent_action GROUP BY state'
                ).fetchall()
            )
        calls = {k.decode(): int(v) for k, v in client.hgetall(OUTAGE_CALLS_KEY).items()}
        client.delete(OUTAGE_CALLS_KEY)
    met = sum(outcome["states"].values())
    failed = outcome["states"].get("FAILED", 0)
    down = calls.get("down", 0)
    lost = set(states) - {"DONE", "FAILED"}
    if lost or states.get("FAILED", 0) != failed:
        raise AssertionError(
            f"{name}: an action that never met the outage did not end DONE: {states}"
        )
    done_after = outcome["done_after"]
    return Result(
        scenario=name,
        n=n,
        actions_per_s=round(down / outage, 1),
        p50_ms=ms(percentile(done_after, 50)) if done_after else None,
        p99_ms=ms(percentile(done_after, 99)) if done_after else None,
        ratio=round((met - failed) / met, 3) if met else None,
        ratio_to="met-outage",
        extra={
            "outage_s": outage,
            "outage_at_default_base_s": outage * TIME_SCALE,
            "retry_base_s": RETRY_BASE_S,
            "max_attempts": max_attempts,
            "outage_threshold": threshold,
            "outage_hold_s": hold,
            "rate_per_s": RATE,
            "met_outage": met,
            "failed": failed,
            "calls_while_down": down,
            "calls_while_down_per_action_met": round(down / met, 2) if met else None,
            "actions_per_s_is": "calls a second to the provider while it was down",
            "calls_up": calls.get("up", 0),
            "drained_after_back_s": round(drained - back, 3),
            "latency_is": "provider back -> DONE, the actions that met the outage",
        },
    )


def _db_now(conn: psycopg.Connection[Any]) -> float:
    row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
    assert row is not None
    return float(row[0])


def run(scale: Scale) -> list[Result]:
    # A tiny run (the smoke test's) checks the scenario: the short outage only.
    outages = list(OUTAGES.items()) if scale.factor >= TINY else list(OUTAGES.items())[:1]
    return [run_outage(scale, name, *outage) for name, outage in outages]
