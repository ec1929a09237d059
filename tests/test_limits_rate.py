"""Rate limits: shared slots in PostgreSQL, reserved right before each attempt. Never more than
the limit in any window at the provider (counted in the adapter, and at a real local receiver
in real claimer and worker processes), never an attempt spent on waiting, never a run early; a
provider's pause holds every worker; hostile limits are refused with clear errors."""

from __future__ import annotations

import asyncio
import bisect
import time
from datetime import timedelta

import psycopg
import pytest
from hypothesis import given
from hypothesis import strategies as st

from outbox import ActionAttempt, ActionKind, ActionRequest, Defer, Done, enqueue_many
from outbox.config import Settings
from outbox.errors import ConfigurationError
from outbox.executor import RATE_LIMITED
from outbox.limits import MAX_COUNT, KindLimits, Rate, effective_limits, parse_limits
from outbox.limits_view import limits_view, render_limits
from outbox.testing import drain
from tests.dispatch_support import DispatchRig
from tests.support import rows

LEASE = timedelta(minutes=5)


def max_in_window(times: list[float], window: float) -> int:
    """The most of ``times`` in any half-open window [t, t + window)."""
    ordered = sorted(times)
    return max(
        (bisect.bisect_left(ordered, t + window) - i for i, t in enumerate(ordered)), default=0
    )


class CountingAdapter:
    """Passes the fence, then counts the provider call with the time it reached "the provider"."""

    def __init__(self, script=None) -> None:
        self.calls: list[tuple[int, float]] = []
        self.script = script

    async def execute(self, attempt: ActionAttempt):
        if not await attempt.fence().begin_write():
            from outbox import Abandoned

            return Abandoned()
        self.calls.append((attempt.id, time.monotonic()))
        if self.script is not None:
            return self.script(attempt)
        return Done()


def limited_kind(name: str, **limits) -> ActionKind:
    return ActionKind(name, limits=KindLimits(**limits))


async def run_pools(outboxes, until, timeout: float = 60.0) -> None:
    """Each outbox claims and runs in a loop of its own (two worker pools, one database)."""
    deadline = time.monotonic() + timeout

    async def pool(ob) -> None:
        async with ob.store() as store:
            executor = ob.executor(store)
            while not until():
                assert time.monotonic() < deadline, "actions did not end in time"
                if not await ob.claim_and_run(executor, limit=20):
                    await asyncio.sleep(0.02)

    await asyncio.gather(*(pool(ob) for ob in outboxes))


def test_a_rate_is_never_exceeded_in_any_window_across_two_pools(make_outbox, conn, schema):
    kind = limited_kind("PING", rate=Rate(20, timedelta(seconds=1)))
    adapter = CountingAdapter()
    pools = []
    for _ in range(2):
        ob = make_outbox()
        ob.register(kind, adapter)
        pools.append(ob)
    pools[0].migrate()
    n = 70
    requests = [ActionRequest(kind, f"l{i}", f"k{i}", workspace_id="w") for i in range(n)]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()
    started = time.monotonic()
    asyncio.run(run_pools(pools, lambda: len(adapter.calls) >= n))
    took = time.monotonic() - started
    times = [t for _, t in adapter.calls]
    assert len({i for i, _ in adapter.calls}) == n
    assert max_in_window(times, 1.0) <= 20
    # Spaced evenly: 70 calls at 20/s take about 3.5 s (the first is free).
    assert (n - 1) / 20 * 0.95 <= times[-1] - min(times), took
    ended = rows(conn, schema)
    assert {r["state"] for r in ended} == {"DONE"}
    # Waiting for a slot never spent an attempt.
    assert {r["attempt"] for r in ended} == {1}


def test_a_per_key_rate_limits_each_key_alone(make_outbox, conn, schema):
    kind = limited_kind("PER_KEY", key_rate=Rate(5, timedelta(seconds=1)))
    adapter = CountingAdapter()
    ob = make_outbox()
    ob.register(kind, adapter)
    ob.migrate()
    requests = [
        ActionRequest(kind, f"{w}-{i}", f"{w}-{i}", workspace_id=w)
        for w in ("a", "b")
        for i in range(10)
    ]
    actions = enqueue_many(conn, requests, schema=schema)
    conn.commit()
    workspace = {a.id: a.workspace_id for a in actions}
    asyncio.run(run_pools([ob], lambda: len(adapter.calls) >= 20))
    for w in ("a", "b"):
        times = [t for i, t in adapter.calls if workspace[i] == w]
        assert max_in_window(times, 1.0) <= 5
    # The two keys ran side by side: 20 calls in about the time of one key's 10.
    every = [t for _, t in adapter.calls]
    assert max_in_window(every, 1.0) >= 8


def test_a_slot_too_far_away_defers_without_spending_an_attempt(make_outbox, conn, schema):
    # A key's rate (the claimer's bound follows a kind's rate, not a key's): both are claimed.
    kind = limited_kind("SLOW", key_rate=Rate(1, timedelta(minutes=1)))
    adapter = CountingAdapter()
    ob = make_outbox()
    ob.register(kind, adapter)
    ob.migrate()
    requests = [ActionRequest(kind, f"l{i}", f"k{i}", workspace_id="w") for i in range(2)]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()

    async def one_round():
        async with ob.store() as store:
            return await ob.claim_and_run(ob.executor(store))

    outcomes = asyncio.run(one_round())
    assert sorted(type(o.result).__name__ for o in outcomes) == ["Defer", "Done"]
    assert len(adapter.calls) == 1
    (waiting,) = rows(conn, schema, "state = 'ADMITTED'")
    assert waiting["attempt"] == 0 and waiting["retry_reason"] == RATE_LIMITED
    # Due again about when its slot comes (a minute after the first), never before.
    (done,) = rows(conn, schema, "state = 'DONE'")
    wait = (waiting["available_at"] - done["ended_at"]).total_seconds()
    assert 50 <= wait <= 62, wait
    # What status, the metrics and a console see: the wait, and the key's bucket a minute out.
    view = limits_view(conn, ob.kind_limits(), schema=schema)
    assert view.kinds["SLOW"].waiting == 1 and view.kinds["SLOW"].rate_limited == 1
    assert view.kinds["SLOW"].limits == {
        "rate": None,
        "key_rate": "1/60s",
        "concurrency": None,
        "key_concurrency": None,
    }
    (bucket,) = view.buckets
    assert bucket["kind"] == "SLOW" and bucket["limit_key"] == "w"
    assert 55 <= bucket["next_slot_in"] <= 62  # the next free slot, a minute after the run
    text = render_limits(view)
    assert "SLOW: limits key_rate=1/60s; 1 waiting not yet due (1 for a rate limit)" in text
    assert "rate SLOW key w: next slot in" in text


def test_a_providers_pause_holds_every_worker_and_spends_no_attempt(make_outbox, conn, schema):
    paused = {"done": False}

    def script(attempt):
        if not paused["done"]:
            paused["done"] = True
            return Defer(timedelta(seconds=2), "HTTP_429")
        return Done()

    # One at a time (a cap of one), so every action after the first reserves its slot after
    # the pause came back.
    kind = limited_kind("PAUSED", rate=Rate(100, timedelta(seconds=1)), concurrency=1)
    adapter = CountingAdapter(script)
    ob = make_outbox()
    ob.register(kind, adapter)
    ob.migrate()
    requests = [ActionRequest(kind, f"l{i}", f"k{i}", workspace_id="w") for i in range(5)]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()
    asyncio.run(run_pools([ob], lambda: len(adapter.calls) >= 6, timeout=30))
    first = adapter.calls[0][1]
    later = [t for _, t in adapter.calls[1:]]
    assert min(later) - first >= 1.9, [t - first for t in later]
    ended = rows(conn, schema)
    assert {r["state"] for r in ended} == {"DONE"} and {r["attempt"] for r in ended} == {1}


# -- hostile limits ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Rate(0, timedelta(seconds=1)), "from 1 to"),
        (lambda: Rate(-5, timedelta(seconds=1)), "from 1 to"),
        (lambda: Rate(10, timedelta(0)), "positive"),
        (lambda: Rate(10, timedelta(seconds=-1)), "positive"),
        (lambda: Rate(10**9, timedelta(seconds=1)), "from 1 to"),
        (lambda: Rate(100_000, timedelta(seconds=1)), "apart"),
        (lambda: Rate(1, timedelta(days=30)), "at most"),
        (lambda: Rate(True, timedelta(seconds=1)), "integer"),
        (lambda: Rate.parse("fast"), "not a rate"),
        (lambda: Rate.parse("10/0s"), "more than zero"),
        (lambda: Rate.parse("-1/s"), "not a rate"),
        (lambda: KindLimits(concurrency=0), "from 1 to"),
        (lambda: KindLimits(key_concurrency=-3), "from 1 to"),
        (lambda: KindLimits(rate="50/s"), "must be a Rate"),  # type: ignore[arg-type]
        (lambda: ActionKind("X", limits={"rate": 5}), "KindLimits"),  # type: ignore[arg-type]
    ],
)
def test_hostile_limits_are_refused_with_a_clear_error(make, message):
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("EMAIL rate=5/s", "KIND: name=value"),
        ("email: rate=5/s", "KIND: name=value"),
        ("EMAIL: speed=5/s", "must be one of"),
        ("EMAIL: rate=0/s", "from 1 to"),
        ("EMAIL: rate=5/0s", "more than zero"),
        ("EMAIL: concurrency=-1", "from 1 to"),
        ("EMAIL: concurrency=ten", "invalid literal"),
        ("EMAIL: rate=5/s; EMAIL: rate=6/s", "given twice"),
    ],
)
def test_hostile_limit_settings_are_refused_before_anything_runs(text, message):
    with pytest.raises(ConfigurationError, match=message):
        Settings(limits=text)
    with pytest.raises(ConfigurationError, match=message):
        Settings.from_env({"OUTBOX_LIMITS": text})


def test_settings_override_a_kinds_declaration_field_by_field():
    declared = {"EMAIL": KindLimits(rate=Rate.parse("14/s"), key_concurrency=10)}
    limits = effective_limits(declared, "EMAIL: key_concurrency=none, concurrency=50; X: rate=1/m")
    assert limits["EMAIL"] == KindLimits(rate=Rate(14, timedelta(seconds=1)), concurrency=50)
    assert limits["X"] == KindLimits(rate=Rate(1, timedelta(minutes=1)))
    assert parse_limits("") == {}


@given(st.integers(1, MAX_COUNT), st.sampled_from(["ms", "s", "m", "h", "d"]), st.integers(1, 24))
def test_a_rate_is_accepted_exactly_when_its_spacing_and_interval_are_sane(count, unit, amount):
    seconds = amount * {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}[unit]
    text = f"{count}/{amount}{unit}"
    sane = seconds <= 86400 and seconds / count >= 0.0001
    if sane:
        rate = Rate.parse(text)
        assert rate.count == count and abs(rate.per.total_seconds() - seconds) < 1e-6
        # Spaced evenly: count slots span the interval, never less (rounded up by at most a
        # microsecond each).
        span = rate.spacing * count
        assert rate.per <= span <= rate.per + timedelta(microseconds=count)
    else:
        with pytest.raises(ValueError):
            Rate.parse(text)


def test_drain_runs_a_rate_limited_kind_to_the_end(make_outbox, conn, schema):
    kind = limited_kind("DRAINED", rate=Rate(50, timedelta(seconds=1)), concurrency=2)
    adapter = CountingAdapter()
    ob = make_outbox()
    ob.register(kind, adapter)
    ob.migrate()
    requests = [ActionRequest(kind, f"l{i}", f"k{i}", workspace_id="w") for i in range(10)]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()
    report = drain(ob)
    assert report.count()["done"] == 10
    assert max_in_window([t for _, t in adapter.calls], 1.0) <= 50


# -- real claimer and worker processes ---------------------------------------------------------


@pytest.fixture
def limited_rig(database_url: str, schema: str, redis_url: str):
    from tests.test_dispatch import _rig

    yield from _rig(database_url, schema, redis_url)


@pytest.mark.slow
def test_real_processes_two_claimers_two_workers_keep_the_rate_at_the_provider(
    limited_rig: DispatchRig,
) -> None:
    rig = limited_rig
    # A lease long enough that a call whose fence came back late can wait for a fresh slot.
    env = {
        "OUTBOX_LIMITS": f"{rig.rb}: rate=20/s",
        "OUTBOX_LEASE_SECONDS": "30",
        "OUTBOX_WRITE_MARGIN_SECONDS": "5",
    }
    rig.worker(processes=2, threads=8, **env)
    rig.claimer(**env)
    rig.claimer(**env)
    ids = rig.enqueue(rig.rb, lanes=100, per_lane=1)
    ended = rig.wait_ended(ids, timeout=120)
    assert {r["state"] for r in ended} == {"DONE"}
    assert {r["attempt"] for r in ended} == {1}  # waiting spent no attempt
    with psycopg.connect(rig.database_url) as conn:
        written = [
            row[0]
            for row in conn.execute(
                f'SELECT extract(epoch FROM called_at)::float8 FROM "{rig.schema}".dispatch_effect'
            )
        ]
    assert len(written) == 100
    assert max_in_window(written, 1.0) <= 20, rig.logs()
    span = max(written) - min(written)
    assert 99 / 20 * 0.95 <= span <= 99 / 20 * 1.5, span


@pytest.mark.slow
def test_real_processes_keep_a_per_key_concurrency_cap(limited_rig: DispatchRig) -> None:
    rig = limited_rig
    limits = f"{rig.rb}: key_concurrency=3"
    rig.worker(processes=2, threads=8, OUTBOX_LIMITS=limits)
    rig.claimer(OUTBOX_LIMITS=limits)
    rig.claimer(OUTBOX_LIMITS=limits)
    ids = rig.enqueue(rig.rb, lanes=24, per_lane=1, payload={"sleep": 0.2})
    ended = rig.wait_ended(ids, timeout=120)
    assert {r["state"] for r in ended} == {"DONE"}
    calls = rig.calls()
    events = sorted(
        [(c["started_at"], 1) for c in calls] + [(c["finished_at"], -1) for c in calls],
        key=lambda e: (e[0], e[1]),
    )
    running = peak = 0
    for _, step in events:
        running += step
        peak = max(peak, running)
    assert peak <= 3, peak
    assert peak == 3  # the cap is reached, not just respected by running one at a time


def test_retention_drops_rate_buckets_nobody_used_for_a_day(make_outbox, conn, schema):
    from outbox.maintenance.retention import Retention

    ob = make_outbox()
    ob.migrate()
    conn.execute(
        f'INSERT INTO "{schema}".agent_action_rate (bucket, used_at) VALUES'
        " ('OLD', now() - interval '2 days'), ('NEW', now()),"
        " ('HELD', now() - interval '2 days')"
    )
    conn.execute(
        f"UPDATE \"{schema}\".agent_action_rate SET held_until = now() + interval '1 hour'"
        " WHERE bucket = 'HELD'"
    )
    conn.commit()

    async def turn() -> None:
        async with ob.store() as store:
            await Retention(timedelta(seconds=1), timedelta(days=30)).run(store)

    asyncio.run(turn())
    left = conn.execute(f'SELECT bucket FROM "{schema}".agent_action_rate ORDER BY 1').fetchall()
    assert [row[0] for row in left] == ["HELD", "NEW"]
