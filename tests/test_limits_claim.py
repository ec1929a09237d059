"""At claim time: scheduled sends (`not_before`), priority within a kind, fairness between limit
keys (workspaces by default), and the concurrency caps per kind and per key. On PostgreSQL,
through the real claim statements; claims are not taken, so what a claim chose stays visible."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import ActionKind, ActionRequest, admit, enqueue, enqueue_many
from outbox._io import run_async, run_sync
from outbox.dispatch.claimer import bounded_claim_operation
from outbox.dispatch.consumption import ConsumptionWatch
from outbox.limits import KindLimits
from outbox.results import Finish
from outbox.state import ActionState
from outbox.store import ClaimedAction
from tests.support import expected_lanes, fold_lane_intake, lanes

NOTE = ActionKind("NOTE")
LEASE = timedelta(minutes=5)


def build(make_outbox, **overrides):
    ob = make_outbox(**overrides)
    ob.declare(NOTE)
    ob.migrate()
    return ob


def req(lane: str, key: str, workspace: str = "w", **fields) -> ActionRequest:
    return ActionRequest(NOTE, lane_key=lane, idempotency_key=key, workspace_id=workspace, **fields)


async def claim(ob, limit: int, **kwargs) -> list[ClaimedAction]:
    async with ob.store() as store:
        return await store.claim({NOTE.name: limit}, LEASE, take=False, **kwargs)


def claim_now(ob, limit: int, **kwargs) -> list[ClaimedAction]:
    return asyncio.run(claim(ob, limit, **kwargs))


def db_now(conn) -> datetime:
    return conn.execute("SELECT now()").fetchone()[0]


# -- not_before --------------------------------------------------------------------------------


def test_a_scheduled_action_never_runs_early_and_holds_its_lane(make_outbox, conn, schema):
    ob = build(make_outbox)
    when = db_now(conn) + timedelta(seconds=2)
    scheduled = enqueue(conn, req("L", "scheduled", not_before=when), schema=schema)
    behind = enqueue(conn, req("L", "behind"), schema=schema)
    other = enqueue(conn, req("M", "other"), schema=schema)
    conn.commit()
    assert scheduled.available_at == when
    claimed = [c.action.id for c in claim_now(ob, 10)]
    # The other lane runs; the scheduled head holds its lane: the action behind it waits too.
    assert claimed == [other.id]
    deadline = time.monotonic() + 30
    while not (got := claim_now(ob, 10)):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert [c.action.id for c in got] == [scheduled.id]
    # Claimed no earlier than its not_before, by the database clock.
    claimed_at = got[0].action.lease_until - LEASE
    assert claimed_at >= when
    assert behind.id not in [c.action.id for c in claim_now(ob, 10)]  # its lane is busy
    conn.rollback()
    assert lanes(conn, schema) == expected_lanes(conn, schema)


def test_a_past_not_before_is_due_now_and_an_admit_keeps_a_future_one(make_outbox, conn, schema):
    ob = build(make_outbox)
    now = db_now(conn)
    past = enqueue(conn, req("P", "past", not_before=now - timedelta(days=1)), schema=schema)
    proposal = enqueue(
        conn,
        req("Q", "proposal", not_before=now + timedelta(hours=1), proposal=True),
        schema=schema,
    )
    conn.commit()
    assert past.available_at >= now
    admitted = admit(conn, proposal.id, schema=schema)
    conn.commit()
    assert admitted.available_at >= now + timedelta(hours=1)  # the admit does not make it due
    assert [c.action.id for c in claim_now(ob, 10)] == [past.id]


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"not_before": datetime(2030, 1, 1)}, "not_before", "timezone-aware"),
        ({"not_before": "tomorrow"}, "not_before", "timezone-aware"),
        (
            {
                "not_before": datetime(2030, 1, 2, tzinfo=UTC),
                "expires_at": datetime(2030, 1, 1, tzinfo=UTC),
            },
            "not_before",
            "before expires_at",
        ),
        ({"priority": 10**9}, "priority", "-100 to 100"),
        ({"priority": True}, "priority", "-100 to 100"),
        ({"priority": 1.5}, "priority", "-100 to 100"),
        ({"limit_key": ""}, "limit_key", "non-empty"),
        ({"limit_key": "a\x00b"}, "limit_key", "NUL"),
    ],
)
def test_hostile_scheduling_and_priority_values_are_refused(fields, field, message):
    from outbox import InvalidActionRequest

    with pytest.raises(InvalidActionRequest) as caught:
        req("L", "k", **fields).validate()
    assert caught.value.field == field
    assert message in str(caught.value)


@given(st.integers())
def test_priority_is_accepted_exactly_from_minus_100_to_100(priority):
    from outbox import InvalidActionRequest

    request = req("L", "k", priority=priority)
    if -100 <= priority <= 100:
        request.validate()
    else:
        with pytest.raises(InvalidActionRequest):
            request.validate()


def scheduled_flags(conn, schema: str) -> dict[str, bool]:
    rows = conn.execute(f'SELECT lane_key, head_scheduled FROM "{schema}".agent_action_lane')
    return dict(rows.fetchall())


def test_a_claim_walks_past_keys_whose_heads_are_all_scheduled(make_outbox, conn, schema):
    """Forty workspaces (more than a claim walks) with nothing but a reminder for tomorrow come
    first in key order; the claim still takes the due actions of the workspace after them."""
    ob = build(make_outbox)
    tomorrow = db_now(conn) + timedelta(days=1)
    enqueue_many(
        conn,
        [req(f"later-{i}", f"later-{i}", f"a{i:02d}", not_before=tomorrow) for i in range(40)],
        schema=schema,
    )
    due = enqueue_many(conn, [req(f"due-{i}", f"due-{i}", "w") for i in range(3)], schema=schema)
    conn.commit()
    assert sorted(c.action.id for c in claim_now(ob, 10)) == sorted(a.id for a in due)
    assert claim_now(ob, 10) == []
    conn.rollback()
    assert lanes(conn, schema) == expected_lanes(conn, schema)


def test_a_claimers_round_claims_a_scheduled_action_in_the_round_after_its_time(
    make_outbox, conn, schema
):
    """The round's first look promotes the lanes whose time came (its fold) before it asks
    which kinds have heads waiting: the round that first sees the action due claims it."""
    build(make_outbox)
    soon = db_now(conn) + timedelta(seconds=0.5)
    scheduled = enqueue(conn, req("L", "soon", not_before=soon), schema=schema)
    conn.commit()

    def one_round() -> tuple[list[int], float | None]:
        with psycopg.connect(conn.info.dsn) as c:
            op = bounded_claim_operation(schema, [NOTE.name], 64, 100, LEASE, ConsumptionWatch())
            with c.transaction():
                took = run_sync(c, op)
                return [x.action.id for x in took.claimed], took.next_due_in

    claimed, due_in = one_round()
    # Nothing claimed; the round says how long until the head comes due (the claimer's wait).
    assert claimed == [] and due_in is not None and 0 < due_in <= 0.5
    assert scheduled_flags(conn, schema) == {"L": True}
    conn.rollback()
    time.sleep(0.6)
    assert one_round() == ([scheduled.id], None)


def test_a_round_says_when_the_soonest_scheduled_head_of_its_own_kinds_comes_due(
    make_outbox, conn, schema
):
    """Another kind's scheduled lanes (a claimer that serves some kinds only) do not count, and
    are not stepped over: the round reads one index entry a kind."""
    ob = build(make_outbox)
    other = ActionKind("OTHER")
    ob.declare(other)
    ob.migrate()
    now = db_now(conn)
    enqueue_many(
        conn,
        [
            ActionRequest(
                other,
                lane_key=f"o{i}",
                idempotency_key=f"o{i}",
                workspace_id="w",
                not_before=now + timedelta(minutes=1, seconds=i),
            )
            for i in range(2_000)
        ],
        schema=schema,
    )
    enqueue(conn, req("L", "mine", not_before=now + timedelta(hours=1)), schema=schema)
    conn.commit()

    def next_due_in(kinds: list[str]) -> float | None:
        with psycopg.connect(conn.info.dsn) as c:
            op = bounded_claim_operation(schema, kinds, 64, 100, LEASE, ConsumptionWatch())
            with c.transaction():
                due_in = run_sync(c, op).next_due_in
            c.execute("SELECT pg_stat_force_next_flush()")
            c.commit()
            return due_in

    def lane_entries_read() -> int:
        with psycopg.connect(conn.info.dsn, autocommit=True) as c:
            (read,) = c.execute(
                "SELECT sum(idx_tup_read) FROM pg_stat_user_indexes"
                " WHERE schemaname = %s AND relname = 'agent_action_lane'",
                (schema,),
            ).fetchone() or (None,)
            return int(read)

    before = lane_entries_read()
    mine = next_due_in([NOTE.name])
    assert mine is not None and 3_590 < mine <= 3_600
    # The fold's promote, the kinds with heads waiting and the soonest due time: a few entries
    # of the lane table's indexes, not the other kind's 2,000.
    assert lane_entries_read() - before < 20
    both = next_due_in([NOTE.name, other.name])
    assert both is not None and 50 < both <= 60


def test_the_fold_promotes_due_scheduled_lanes_a_batch_at_a_time_and_never_waits(
    make_outbox, conn, schema, database_url
):
    """The fold promotes up to its batch of the lanes whose scheduled head came due and counts
    them with what it folded; a lane row another transaction holds is passed over, not waited
    for, and promoted by a later fold."""
    build(make_outbox)
    soon = db_now(conn) + timedelta(seconds=0.3)
    enqueue_many(
        conn, [req(f"L{i}", f"k{i}", f"w{i}", not_before=soon) for i in range(5)], schema=schema
    )
    conn.commit()
    assert fold_lane_intake(conn, schema) == 5  # the enqueue's lanes, none due yet
    conn.commit()
    assert set(scheduled_flags(conn, schema).values()) == {True}
    conn.rollback()
    time.sleep(0.4)
    with psycopg.connect(database_url) as holder:
        holder.execute(
            f"SELECT 1 FROM \"{schema}\".agent_action_lane WHERE lane_key = 'L0' FOR UPDATE"
        )
        conn.execute("SET statement_timeout = '5s'")
        fold = f'SELECT "{schema}".agent_action_lane_intake(%s)'
        assert conn.execute(fold, (3,)).fetchone()[0] == 3
        conn.commit()
        assert conn.execute(fold, (3,)).fetchone()[0] == 1  # L0 is held: passed over
        conn.commit()
        assert scheduled_flags(conn, schema) == {
            "L0": True,
            "L1": False,
            "L2": False,
            "L3": False,
            "L4": False,
        }
        conn.rollback()
    assert conn.execute(fold, (3,)).fetchone()[0] == 1
    conn.commit()
    assert set(scheduled_flags(conn, schema).values()) == {False}
    conn.rollback()
    assert lanes(conn, schema) == expected_lanes(conn, schema)


# -- priority ----------------------------------------------------------------------------------


def test_a_transactional_action_is_claimed_first_behind_a_deep_bulk_backlog(
    make_outbox, conn, schema
):
    ob = build(make_outbox)
    bulk = [req(f"bulk-{i}", f"bulk-{i}") for i in range(5_000)]
    enqueue_many(conn, bulk, schema=schema)
    urgent = enqueue(conn, req("reset", "reset", priority=50), schema=schema)
    conn.commit()
    first = claim_now(ob, 5)
    assert urgent.id in [c.action.id for c in first]


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(st.lists(st.integers(-100, 100), min_size=1, max_size=12))
def test_claims_come_in_priority_order_then_due_order(make_outbox, database_url, schema, prios):
    ob = build(make_outbox)
    with psycopg.connect(database_url, autocommit=True) as c:
        c.execute(f'TRUNCATE "{schema}".agent_action, "{schema}".agent_action_lane')
        c.execute(f'TRUNCATE "{schema}".agent_action_lane_intake')
        ids = [
            enqueue(c, req(f"l{i}", f"k{i}", priority=p), schema=schema).id
            for i, p in enumerate(prios)
        ]
    order = []
    for _ in prios:
        (got,) = claim_now(ob, 1)
        order.append(got.action.id)
    by_priority = sorted(ids, key=lambda i: (-prios[ids.index(i)], i))
    assert order == by_priority


# -- fairness ----------------------------------------------------------------------------------


def test_one_workspaces_backlog_does_not_starve_anothers_single_action(make_outbox, conn, schema):
    ob = build(make_outbox)
    enqueue_many(conn, [req(f"a-{i}", f"a-{i}", "big") for i in range(5_000)], schema=schema)
    single = enqueue(conn, req("b-0", "b-0", "small"), schema=schema)
    conn.commit()
    first = claim_now(ob, 10)
    assert len(first) == 10
    assert single.id in [c.action.id for c in first]


def test_the_round_robin_reaches_every_workspace_even_with_more_than_a_claim_holds(
    make_outbox, conn, schema
):
    ob = build(make_outbox)
    requests = [req(f"{w}-{i}", f"{w}-{i}", f"ws{w:02d}") for w in range(30) for i in range(3)]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()

    async def rounds() -> list[list[ClaimedAction]]:
        async with ob.store() as store:  # one store: its round robin carries on
            return [await store.claim({NOTE.name: 5}, LEASE, take=False) for _ in range(6)]

    claimed = asyncio.run(rounds())
    seen = {c.action.workspace_id for batch in claimed for c in batch}
    assert len(seen) == 30, sorted(seen)
    # No workspace got a second action before every one had its first.
    assert all(len({c.action.workspace_id for c in batch}) == 5 for batch in claimed)


def test_a_limit_key_overrides_the_workspace_for_fairness(make_outbox, conn, schema):
    ob = build(make_outbox)
    requests = [req(f"x-{i}", f"x-{i}", "w", limit_key="domain:x.example") for i in range(500)]
    enqueue_many(conn, requests, schema=schema)
    other = enqueue(conn, req("y", "y", "w", limit_key="domain:y.example"), schema=schema)
    conn.commit()
    assert other.id in [c.action.id for c in claim_now(ob, 4)]


# -- concurrency caps --------------------------------------------------------------------------


def executing_by_key(conn, schema: str) -> dict[str, int]:
    rows = conn.execute(
        f'SELECT coalesce(limit_key, workspace_id) AS k, count(*) FROM "{schema}".agent_action'
        " WHERE state = 'EXECUTING' GROUP BY 1"
    ).fetchall()
    return dict(rows)


def test_a_per_key_cap_is_never_exceeded_across_claims(make_outbox, conn, schema):
    ob = build(make_outbox)
    requests = [req(f"{w}-{i}", f"{w}-{i}", w) for w in ("a", "b", "c") for i in range(10)]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()
    caps = {NOTE.name: 2}
    first = claim_now(ob, 100, key_caps=caps)
    assert len(first) == 6
    assert executing_by_key(conn, schema) == {"a": 2, "b": 2, "c": 2}
    assert claim_now(ob, 100, key_caps=caps) == []  # no room until one ends

    async def finish_one() -> None:
        async with ob.store() as store:
            await store.finish(first[0].action.token, Finish(ActionState.DONE, "DONE"))

    asyncio.run(finish_one())
    again = claim_now(ob, 100, key_caps=caps)
    assert [c.action.workspace_id for c in again] == [first[0].action.workspace_id]
    conn.rollback()
    assert max(executing_by_key(conn, schema).values()) == 2


def test_a_kind_cap_lowers_the_claimers_in_flight_bound(make_outbox, conn, schema):
    ob = build(make_outbox)
    enqueue_many(conn, [req(f"l{i}", f"k{i}") for i in range(20)], schema=schema)
    conn.commit()
    limits = {NOTE.name: KindLimits(concurrency=3)}

    async def one_round():
        async with ob.store() as store, store.connection() as c, c.transaction():
            op = bounded_claim_operation(
                schema, [NOTE.name], 64, 100, LEASE, ConsumptionWatch(), limits, {}
            )
            return await run_async(c, op)

    assert len(asyncio.run(one_round()).claimed) == 3
    assert len(asyncio.run(one_round()).claimed) == 0  # three in flight already


# -- one statement a claim ---------------------------------------------------------------------


def rows_of_a_claim(conn, schema: str, limit: int, **kwargs) -> list[tuple[str, list[dict]]]:
    """The statements one ``claim_operation`` ran, by name, in order, with the rows each
    returned (rolled back)."""
    from outbox.queries import queries_for
    from outbox.store import claim_operation

    names = {sql: name for name, sql in queries_for(schema).items()}
    ran: list[tuple[str, list[dict]]] = []
    op = claim_operation(schema, {NOTE.name: limit}, LEASE, take=False, **kwargs)
    with conn.transaction(force_rollback=True), conn.cursor() as cur:
        try:
            statement = next(op)
            while True:
                # Each statement's rows as the operation reads them (a claim's: its own rows);
                # the test reads them as dicts.
                cur.row_factory = statement.rows or psycopg.rows.dict_row
                cur.execute(statement.sql, statement.params)
                rows = cur.fetchall()
                ran.append((names[statement.sql], [as_dict(row) for row in rows]))
                statement = op.send(rows)
        except StopIteration:
            pass
    return ran


def as_dict(row: Any) -> dict:
    """A row as a dict of its columns: a claim's row (``outbox.store.ClaimRow``) as its action's
    fields (or a NULL id), the keys it walked and whether a key filled its share."""
    if isinstance(row, dict):
        return row
    claimed, walked, filled = row
    return {
        "walked": walked,
        "filled": filled,
        **(claimed.action.as_dict() if claimed else {"id": None}),
    }


def statements_of_a_claim(conn, schema: str, limit: int, **kwargs) -> list[str]:
    """The statements one ``claim_operation`` ran, by name, in order (rolled back)."""
    return [name for name, _ in rows_of_a_claim(conn, schema, limit, **kwargs)]


def test_a_claim_reclaims_walks_the_keys_and_claims_in_one_statement(make_outbox, conn, schema):
    build(make_outbox)
    enqueue_many(conn, [req(f"l{i}", f"k{i}", f"ws{i % 3}") for i in range(9)], schema=schema)
    conn.commit()
    assert statements_of_a_claim(conn, schema, 6) == ["lane_intake", "claim_heads"]


def test_a_claim_names_the_keys_it_walked_once_not_on_every_row(make_outbox, conn, schema):
    build(make_outbox)
    requests = [req(f"{w}-{i}", f"{w}-{i}", f"ws{w:02d}") for w in range(40) for i in range(3)]
    enqueue_many(conn, requests, schema=schema)
    conn.commit()
    # 32 keys (FAIR_KEYS_PER_CLAIM), 3 heads each: the claim fills its 96 in one statement.
    ((_, _), (name, rows)) = rows_of_a_claim(conn, schema, 96)
    assert name == "claim_heads"
    assert len(rows) == 96
    assert rows[0]["walked"] == [f"ws{w:02d}" for w in range(32)]
    assert all(row["walked"] is None for row in rows[1:])


def cyclic_walk(keys: set[str], after: str, walk: int) -> list[str]:
    """The keys a claim should walk: each once, in order from the first after ``after``,
    wrapping around, at most ``walk``."""
    ordered = sorted(keys)
    start = next((i for i, k in enumerate(ordered) if k > after), 0)
    return (ordered[start:] + ordered[:start])[:walk]


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    keys=st.sets(st.integers(0, 40).map(lambda n: f"k{n:02d}"), min_size=1, max_size=12),
    scheduled=st.sets(st.integers(0, 40).map(lambda n: f"k{n:02d}")),
    after=st.integers(-1, 41).map(lambda n: "" if n < 0 else f"k{n:02d}"),
    limit=st.integers(1, 14),
)
def test_the_walk_visits_each_key_with_a_due_head_once_in_cyclic_order_from_the_cursor(
    make_outbox, database_url, schema, keys, scheduled, after, limit
):
    """Whatever the keys and the cursor: each key with a due head is walked once, a key whose
    heads wait only for their time is not walked at all, and the walk stops at the key it
    began with, never reading it twice."""
    build(make_outbox)
    later = datetime.now(UTC) + timedelta(hours=1)
    with psycopg.connect(database_url, autocommit=True) as c:
        c.execute(f'TRUNCATE "{schema}".agent_action, "{schema}".agent_action_lane')
        c.execute(f'TRUNCATE "{schema}".agent_action_lane_intake')
        for key in sorted(keys):
            when = {"not_before": later} if key in scheduled else {}
            enqueue(c, req(f"lane-{key}", f"idem-{key}", key, **when), schema=schema)
        ((_, _), (name, rows), *_) = rows_of_a_claim(c, schema, limit, cursor={NOTE.name: after})
    assert name == "claim_heads"
    assert (rows[0]["walked"] or []) == cyclic_walk(keys - scheduled, after, min(limit, 32))


def capped_walk(keys: set[str], capped: set[str], after: str, walk: int, steps: int) -> list[str]:
    """The keys a claim under a cap should walk: in cyclic order from the first after
    ``after``, until ``walk`` of them are not ``capped`` or ``steps`` were walked in all."""
    walked: list[str] = []
    for key in cyclic_walk(keys, after, len(keys)):
        walked.append(key)
        if len([k for k in walked if k not in capped]) >= walk or len(walked) >= steps:
            break
    return walked


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    keys=st.sets(st.integers(0, 40).map(lambda n: f"k{n:02d}"), min_size=1, max_size=12),
    at_cap=st.lists(st.booleans(), min_size=12, max_size=12),
    idle=st.sets(st.integers(0, 40).map(lambda n: f"k{n:02d}"), max_size=3),
    after=st.integers(-1, 41).map(lambda n: "" if n < 0 else f"k{n:02d}"),
    limit=st.integers(1, 8),
    stepped=st.integers(0, 4),
)
def test_the_walk_under_a_cap_steps_over_keys_at_their_cap_within_its_bound(
    make_outbox, database_url, schema, keys, at_cap, idle, after, limit, stepped
):
    """Whatever the keys, those at their cap and the cursor: the walk goes in cyclic order,
    counts only the keys with room toward its bound, steps over at most ``stepped`` keys at
    their cap besides, and claims one head of each key with room it walked, none of a key at
    its cap."""
    from unittest import mock

    from outbox.store import walk_bound

    # Keys at their cap with a due head, and (``idle``) at their cap with none.
    capped = {key for key, full in zip(sorted(keys), at_cap, strict=False) if full} | idle
    ob = build(make_outbox)
    with psycopg.connect(database_url, autocommit=True) as c:
        c.execute(f'TRUNCATE "{schema}".agent_action, "{schema}".agent_action_lane')
        c.execute(f'TRUNCATE "{schema}".agent_action_lane_intake')
        # Each capped key runs one action (claimed before any other head exists).
        for key in sorted(capped):
            enqueue(c, req(f"busy-{key}", f"busy-{key}", key), schema=schema)
        assert len(claim_now(ob, 100)) == len(capped)
        for key in sorted(keys):
            enqueue(c, req(f"lane-{key}", f"idem-{key}", key), schema=schema)
        with mock.patch("outbox.store.CAPPED_KEYS_PER_CLAIM", stepped):
            ((_, _), (name, rows), *_) = rows_of_a_claim(
                c, schema, limit, cursor={NOTE.name: after}, key_caps={NOTE.name: 1}
            )
    walk = walk_bound(limit, 1)
    expected = capped_walk(keys, capped, after, walk, walk + stepped)
    assert name == "claim_heads"
    assert (rows[0]["walked"] or []) == expected
    claimed = sorted(row["workspace_id"] for row in rows if row["id"] is not None)
    assert claimed == [key for key in sorted(expected) if key not in capped]


def probe_now(conn, schema: str, limit: int) -> list[ClaimedAction]:
    """The claim of a kind a stalled claimer only probes (``reclaims_only``), committed."""
    from outbox._io import run_sync
    from outbox.store import claim_operation

    op = claim_operation(schema, {NOTE.name: limit}, LEASE, take=False, reclaims_only={NOTE.name})
    with conn.transaction():
        return run_sync(conn, op)


def test_a_kind_only_probed_gets_its_expired_claims_back_and_no_waiting_head(
    make_outbox, conn, schema
):
    """A kind whose claims no worker takes (a stalled claimer probes it) is claimed again only
    where a lease ran out: a waiting head, due and idle, stays where it is."""
    ob = build(make_outbox)
    enqueue_many(conn, [req(f"l{i}", f"k{i}") for i in range(3)], schema=schema)
    conn.commit()
    first = claim_now(ob, 2)
    assert len(first) == 2
    assert probe_now(conn, schema, 5) == []
    conn.execute(
        f"UPDATE \"{schema}\".agent_action SET lease_until = now() - interval '1 second'"
        " WHERE id = %s",
        (first[0].action.id,),
    )
    conn.commit()
    again = probe_now(conn, schema, 5)
    assert [(c.action.id, c.action.epoch) for c in again] == [
        (first[0].action.id, first[0].action.epoch + 1)
    ]
    # The head is still there for a claim of the kind.
    assert len(claim_now(ob, 5)) == 1


def test_a_claim_under_a_cap_of_one_walks_as_many_keys_as_its_room(make_outbox, conn, schema):
    """A key at a cap of one gives one head a claim, so a claim of 100 walks 100 keys, not the
    32 that fill it without a cap."""
    from outbox.store import FAIR_KEYS_PER_CLAIM

    ob = build(make_outbox)
    keys = [f"a{w:03d}" for w in range(100)]
    enqueue_many(
        conn, [req(f"{w}-{i}", f"{w}-{i}", w) for w in keys for i in range(2)], schema=schema
    )
    conn.commit()
    claimed = claim_now(ob, 100, key_caps={NOTE.name: 1})
    assert len(claimed) == 100 > FAIR_KEYS_PER_CLAIM
    assert sorted(c.action.workspace_id for c in claimed) == keys


def fill_to_cap(ob, conn, schema: str, keys: list[str], caps: dict[str, int]) -> None:
    """Two lanes a key, one of each claimed: every key at a cap of one, with a due head."""
    enqueue_many(
        conn, [req(f"{w}-{i}", f"{w}-{i}", w) for w in keys for i in range(2)], schema=schema
    )
    conn.commit()
    assert len(claim_now(ob, len(keys), key_caps=caps)) == len(keys)


def two_claims(
    ob, limit: int, caps: dict[str, int]
) -> tuple[list[ClaimedAction], dict[str, str], list[ClaimedAction]]:
    """Two claims of one claimer (one round robin), and its cursor between them."""

    async def rounds() -> tuple[list[ClaimedAction], dict[str, str], list[ClaimedAction]]:
        async with ob.store() as store:
            first = await store.claim({NOTE.name: limit}, LEASE, take=False, key_caps=caps)
            cursor = dict(store.fair_cursor)
            second = await store.claim({NOTE.name: limit}, LEASE, take=False, key_caps=caps)
            return first, cursor, second

    return asyncio.run(rounds())


def test_a_claim_steps_over_keys_at_their_cap_to_a_key_with_room(make_outbox, conn, schema):
    """Keys at their cap do not count toward the walk's bound: a key with room behind more of
    them than one walk holds is claimed by the first claim that starts before them, as is a
    key with room among them; the next claim goes on after the last key with room."""
    from outbox.store import CAPPED_KEYS_PER_CLAIM, FAIR_KEYS_PER_CLAIM

    ob = build(make_outbox)
    # More than a walk of 32 keys holds, fewer than a claim of 2 steps over.
    full = [f"a{w:03d}" for w in range(FAIR_KEYS_PER_CLAIM + 16)]
    assert len(full) + 2 <= 2 + CAPPED_KEYS_PER_CLAIM
    caps = {NOTE.name: 1}
    fill_to_cap(ob, conn, schema, full, caps)
    among = enqueue(conn, req("a020-x", "a020-x", "a0205"), schema=schema)
    later = enqueue(conn, req("z-0", "z-0", "z"), schema=schema)
    conn.commit()
    first, cursor, second = two_claims(ob, 2, caps)
    assert sorted(c.action.id for c in first) == [among.id, later.id]
    assert cursor == {NOTE.name: "z"}
    assert second == []


def test_reclaims_come_first_and_count_toward_the_claim(make_outbox, conn, schema):
    ob = build(make_outbox)
    enqueue_many(conn, [req(f"l{i}", f"k{i}", f"ws{i}") for i in range(3)], schema=schema)
    conn.commit()

    async def lost() -> list[ClaimedAction]:
        async with ob.store() as store:  # leases that run out at once: their claims are lost
            return await store.claim({NOTE.name: 3}, timedelta(0), take=False)

    expired = {c.action.id for c in asyncio.run(lost())}
    assert len(expired) == 3
    enqueue_many(conn, [req(f"m{i}", f"n{i}", f"ws{i}") for i in range(5)], schema=schema)
    conn.commit()
    claimed = claim_now(ob, 4)
    assert {c.action.id for c in claimed[:3]} == expired
    assert len(claimed) == 4 and claimed[3].action.id not in expired


def test_a_claim_among_more_keys_at_their_cap_than_it_steps_over_stops_and_the_next_goes_on(
    make_outbox, conn, schema
):
    """A claim steps over at most ``CAPPED_KEYS_PER_CLAIM`` keys at their cap besides those it
    walks (its cost stays bounded however many keys are full), and its round robin goes on
    after the last of them, so the next claim reaches the key with room beyond."""
    from outbox.store import CAPPED_KEYS_PER_CLAIM

    ob = build(make_outbox)
    full = [f"a{w:03d}" for w in range(CAPPED_KEYS_PER_CLAIM + 44)]
    caps = {NOTE.name: 1}
    fill_to_cap(ob, conn, schema, full, caps)
    later = enqueue(conn, req("z-0", "z-0", "z"), schema=schema)
    conn.commit()
    first, cursor, second = two_claims(ob, 1, caps)
    assert first == []
    # The walk's first key, then as many at their cap as it may step over besides.
    assert cursor == {NOTE.name: full[CAPPED_KEYS_PER_CLAIM]}
    assert [c.action.id for c in second] == [later.id]


def first_claim_then_second(conn, schema: str, limit: int, key_cap: int | None):
    """A claim's first ``claim_heads`` (after the fold), then the second statement that would
    fill the room it left, run whether or not the first asks for it (rolled back): what the
    first took and what the second would have."""
    from outbox.queries import queries_for
    from outbox.store import claimed_rows, heads_claimed, kind_claims, second_claim_statement

    q = queries_for(schema)
    caps = None if key_cap is None else {NOTE.name: key_cap}
    [claim] = kind_claims(q, {NOTE.name: limit}, LEASE, take=False, cursor={}, key_caps=caps)
    with conn.transaction(force_rollback=True), conn.cursor() as cur:
        cur.execute(q["lane_intake"], {"limit": 5000})
        cur.row_factory = claim.statement.rows
        cur.execute(claim.statement.sql, claim.statement.params)
        took = heads_claimed(cur.fetchall(), NOTE.name, {})
        second = second_claim_statement(claim.statement, took, limit)
        cur.execute(second.sql, second.params)
        more = claimed_rows(cur.fetchall())
    return took, more


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    heads=st.lists(st.integers(1, 7), min_size=1, max_size=6),
    key_cap=st.one_of(st.none(), st.integers(1, 4)),
    limit=st.integers(1, 20),
)
def test_a_claim_never_passes_up_a_second_statement_that_would_take_more(
    make_outbox, database_url, schema, heads, key_cap, limit
):
    """Whatever the keys' due heads, the cap and the claim's size: a claim that does not ask a
    second time (``HeadsClaimed.room_for_more``) left nothing a second statement would take."""
    build(make_outbox)
    with psycopg.connect(database_url, autocommit=True) as c:
        c.execute(f'TRUNCATE "{schema}".agent_action, "{schema}".agent_action_lane')
        c.execute(f'TRUNCATE "{schema}".agent_action_lane_intake')
        requests = [
            req(f"k{k}-{i}", f"k{k}-{i}", f"k{k}") for k, n in enumerate(heads) for i in range(n)
        ]
        enqueue_many(c, requests, schema=schema)
        took, more = first_claim_then_second(c, schema, limit, key_cap)
    assert len(took.claimed) + len(more) <= limit
    if not took.room_for_more(limit):
        assert more == [], (took.walked, len(took.claimed))
