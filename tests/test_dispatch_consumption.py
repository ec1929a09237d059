"""Workers that fall a lease behind: the claimer stalls the kind, and once a worker takes its
probe it claims under an adaptive bound (half the depth it fell behind on, grown back while
the workers keep up) instead of flooding them again."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from hypothesis import given
from hypothesis import strategies as st

from outbox import ActionKind, ActionRequest, enqueue_many
from outbox._io import run_async
from outbox.dispatch.claimer import Round, bounded_claim_operation
from outbox.dispatch.consumption import ConsumptionWatch

NOTE = ActionKind("NOTE")
CONFIGURED = 512


def test_a_resumed_kind_claims_half_the_depth_it_fell_behind_on_then_grows_back() -> None:
    watch = ConsumptionWatch()
    watch.stall("NOTE", unconsumed=40, in_flight=64)
    watch.resume("NOTE", CONFIGURED)
    assert watch.bound("NOTE", CONFIGURED) == 32

    watch.kept_up("NOTE", CONFIGURED, in_flight=10)  # the bound held nothing back
    assert watch.bound("NOTE", CONFIGURED) == 32
    watch.kept_up("NOTE", CONFIGURED, in_flight=32)
    assert watch.bound("NOTE", CONFIGURED) == 36

    rounds = 0
    while watch.bound("NOTE", CONFIGURED) < CONFIGURED:
        watch.kept_up("NOTE", CONFIGURED, in_flight=watch.bound("NOTE", CONFIGURED))
        rounds += 1
    assert watch.bounds == {}, "back at the configured bound, the adaptive one is gone"
    assert rounds < 30


def test_a_stall_of_another_kind_leaves_this_kinds_bound_alone() -> None:
    watch = ConsumptionWatch()
    watch.stall("EMAIL", unconsumed=3, in_flight=100)
    watch.resume("EMAIL", CONFIGURED)
    assert watch.bound("WEBHOOK", CONFIGURED) == CONFIGURED
    assert watch.bound("EMAIL", CONFIGURED) == 50


@given(
    depths=st.lists(st.integers(min_value=0, max_value=5_000), min_size=1, max_size=20),
    configured=st.integers(min_value=1, max_value=4_096),
)
def test_the_adaptive_bound_stays_between_one_and_the_configured_bound(
    depths: list[int], configured: int
) -> None:
    watch = ConsumptionWatch()
    for depth in depths:
        watch.stall("NOTE", unconsumed=1, in_flight=depth)
        watch.resume("NOTE", configured)
        assert 1 <= watch.bound("NOTE", configured) <= configured
        watch.kept_up("NOTE", configured, in_flight=depth)
        assert 1 <= watch.bound("NOTE", configured) <= configured


def test_a_claimer_whose_claims_went_unconsumed_resumes_under_half_the_depth(
    make_outbox, conn, schema
) -> None:
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    requests = [
        ActionRequest(NOTE, lane_key=f"l{i}", idempotency_key=f"k{i}", workspace_id="w")
        for i in range(200)
    ]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()
    watch = ConsumptionWatch()
    lease = timedelta(seconds=1)

    async def one_round() -> Round:
        async with ob.store() as store, store.connection() as c, c.transaction():
            op = bounded_claim_operation(schema, [NOTE.name], 64, 100, lease, watch)
            return await run_async(c, op)

    assert len(asyncio.run(one_round()).claimed) == 64
    time.sleep(1.3)  # every lease runs out before any worker took its message

    probe = asyncio.run(one_round()).claimed
    assert len(probe) == 1 and watch.stalled(NOTE.name)

    async def take(token):
        async with ob.store() as store:
            return await store.take_attempt(token)

    assert asyncio.run(take(probe[0].action.token)) is not None  # a worker took the probe

    resumed = asyncio.run(one_round())
    assert not watch.stalled(NOTE.name)
    assert watch.bound(NOTE.name, 64) == 32
    # The probe is in flight: 31 more, not the 63 a configured bound would let through.
    assert len(resumed.claimed) == 31
