"""One finish path: each result maps to one ``Finish`` (``finish_for``), and every finish (end,
retry, deferral) is written by one group-committed statement in which each row keeps its own
epoch check and means exactly what its ``Finish`` says."""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from outbox import (
    Abandoned,
    ActionKind,
    ActionRequest,
    ActionState,
    Cancelled,
    Defer,
    Done,
    Failed,
    Retry,
    Settings,
    StopReason,
    Uncertain,
    enqueue,
)
from outbox.action import Action
from outbox.fence_token import FenceToken
from outbox.results import Finish, finish_for

NOTE = ActionKind("NOTE")
ENDS = [ActionState.DONE, ActionState.UNCERTAIN, ActionState.FAILED, ActionState.CANCELLED]
REASONS = st.sampled_from(["SMTP_RCPT_550", "HTTP_503", "RATE_LIMITED", "ERROR:OSError"])
WAITS = st.timedeltas(min_value=timedelta(0), max_value=timedelta(hours=2))


def an_action(attempt: int, max_attempts: int) -> Action:
    now = datetime.now().astimezone()
    return Action(
        id=1, kind="NOTE", state=ActionState.EXECUTING, workspace_id="w", lane_key="l",
        idempotency_key="k", payload={}, subject_account_id=None, max_attempts=max_attempts,
        expires_at=None, attempt=attempt, epoch=1, available_at=now, lease_until=now,
        write_started_at=None, readback_ref=None, stop_reason=None, created_at=now, ended_at=None,
    )  # fmt: skip


RESULTS = st.one_of(
    st.builds(Done, st.none() | st.text(max_size=8)),
    st.builds(Retry, st.none() | WAITS, st.none() | REASONS),
    st.builds(Defer, WAITS, st.none() | REASONS),
    st.builds(Uncertain, REASONS),
    st.builds(Failed, REASONS),
    st.builds(Cancelled, REASONS),
    st.just(Abandoned()),
)


@given(result=RESULTS, max_attempts=st.integers(1, 6), data=st.data())
def test_each_result_maps_to_the_one_finish_the_contract_names(result, max_attempts, data):
    attempt = data.draw(st.integers(1, max_attempts))
    base, cap = timedelta(seconds=10), timedelta(minutes=10)
    config = Settings().with_overrides(retry_base=base, retry_cap=cap)
    finish = finish_for(result, an_action(attempt, max_attempts), config)
    match result:
        case Abandoned():
            assert finish is None
        case Done(ref=ref):
            assert finish == Finish(ActionState.DONE, StopReason.DONE, ref=ref)
        case Retry(after=after, reason=reason) if attempt < max_attempts:
            assert finish is not None and finish.state is ActionState.ADMITTED
            assert (finish.retry_reason, finish.gives_back_attempt) == (reason, False)
            assert finish.retried
            assert finish.after is not None
            if after is not None:
                assert finish.after == after
            else:  # capped exponential backoff, times a jitter of 0.5..1
                full = min(cap, base * 2 ** (attempt - 1))
                assert full / 2 <= finish.after <= full
        case Retry(reason=reason):
            assert finish == Finish(
                ActionState.FAILED, StopReason.ATTEMPTS_EXHAUSTED, retry_reason=reason, retried=True
            )
        case Defer(after=after, reason=reason):
            assert finish == Finish(
                ActionState.ADMITTED, retry_reason=reason, after=after, gives_back_attempt=True
            )
        case Uncertain(reason=reason) | Failed(reason=reason) | Cancelled(reason=reason):
            assert finish is not None and finish.ends and finish.stop_reason == reason
            assert finish.state.value == type(result).__name__.upper()
            assert (finish.ref, finish.retry_reason, finish.after) == (None, None, None)


def test_a_finish_that_neither_ends_nor_waits_is_refused():
    with pytest.raises(ValueError):
        Finish(ActionState.EXECUTING)
    with pytest.raises(ValueError):
        Finish(ActionState.DONE)  # an end needs its stop reason
    with pytest.raises(ValueError):
        Finish(ActionState.ADMITTED)  # a wait needs its `after`
    with pytest.raises(ValueError):
        Finish(ActionState.FAILED, "X", after=timedelta(0))


# -- the one statement -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Row:
    """One executing action's plan: what it looks like before, and the finish it gets."""

    finish: Finish
    stale: bool  # the finish names the epoch before this claim
    wrote: bool  # this attempt passed its fence
    earlier: bool  # an earlier attempt wrote (earlier_write_at)
    prior_reason: bool  # an earlier retry left its reason


ENDINGS = st.builds(
    Finish,
    st.sampled_from(ENDS),
    REASONS,
    ref=st.none() | st.text(alphabet="abc-123", max_size=6),
    retry_reason=st.none() | REASONS,
)
WAITINGS = st.builds(
    Finish,
    st.just(ActionState.ADMITTED),
    retry_reason=st.none() | REASONS,
    after=WAITS,
    gives_back_attempt=st.booleans(),
)
ROWS = st.builds(
    Row, ENDINGS | WAITINGS, st.booleans(), st.booleans(), st.booleans(), st.booleans()
)


def expected(before: dict, row: Row, now: tuple[datetime, datetime]) -> dict:
    """The row after its finish, by the contract (docs/concepts.md, results.Finish)."""
    if row.stale:
        return before
    f = row.finish
    after = dict(before, state=f.state.value)
    if f.ends:
        after.update(
            stop_reason=f.stop_reason,
            readback_ref=f.ref,
            retry_reason=f.retry_reason or before["retry_reason"],
            payload=None,
        )
    else:
        assert f.after is not None
        after.update(
            retry_reason=f.retry_reason,
            attempt=before["attempt"] - f.gives_back_attempt,
            earlier_write_at=before["write_started_at"] or before["earlier_write_at"],
            write_started_at=None,
            lease_until=None,
            available_at=(now[0] + f.after, now[1] + f.after),
        )
    return after


COLUMNS = (
    "state", "stop_reason", "readback_ref", "retry_reason", "attempt", "epoch", "payload",
    "write_started_at", "earlier_write_at", "lease_until", "available_at", "ended_at",
)  # fmt: skip


def test_every_finish_is_one_batched_statement_and_each_row_keeps_its_epoch_and_meaning(
    make_outbox, database_url, schema
):
    ob = make_outbox()
    ob.declare(NOTE)
    ob.migrate()
    keys = itertools.count()

    def read(conn, ids):
        sql = f'SELECT id, {", ".join(COLUMNS)} FROM "{schema}".agent_action WHERE id = ANY(%s)'
        return {r["id"]: r for r in conn.execute(sql, (ids,))}

    async def run(rows: list[Row]) -> None:
        with psycopg.connect(database_url, row_factory=dict_row) as conn:
            for _ in rows:
                n = next(keys)
                request = ActionRequest(
                    NOTE, workspace_id="w", lane_key=f"l{n}", idempotency_key=f"k{n}"
                )
                enqueue(conn, request, schema=schema)
            conn.commit()
        async with ob.store() as store:
            claimed = await store.claim({"NOTE": len(rows)}, ob.settings.lease)
            assert len(claimed) == len(rows)
            actions = sorted((c.action for c in claimed), key=lambda a: a.id)
            for action, row in zip(actions, rows, strict=True):
                if row.wrote:
                    assert await store.begin_write(action.token, timedelta(0))
            with psycopg.connect(database_url, row_factory=dict_row) as conn:
                for action, row in zip(actions, rows, strict=True):
                    conn.execute(
                        f'UPDATE "{schema}".agent_action SET retry_reason = %s,'
                        " earlier_write_at = CASE WHEN %s THEN now() - interval '1 hour' END"
                        " WHERE id = %s",
                        ("EARLIER" if row.prior_reason else None, row.earlier, action.id),
                    )
                conn.commit()
                ids = [a.id for a in actions]
                before = read(conn, ids)
                (start,) = conn.execute("SELECT now() AS t").fetchone().values()
            finisher = store.group_writers[2]
            statements, calls = finisher.statements, finisher.calls
            recorded = await asyncio.gather(
                *(
                    store.finish(FenceToken(a.id, a.epoch - r.stale), r.finish)
                    for a, r in zip(actions, rows, strict=True)
                )
            )
            if len(rows) > 2:  # the first goes alone; the rest share a statement
                assert finisher.statements - statements < finisher.calls - calls
        with psycopg.connect(database_url, row_factory=dict_row) as conn:
            (end,) = conn.execute("SELECT now() AS t").fetchone().values()
            after = read(conn, ids)
        assert recorded == [not r.stale for r in rows]
        for action, row in zip(actions, rows, strict=True):
            want = expected(before[action.id], row, (start, end))
            got = after[action.id]
            for column in COLUMNS:
                if column == "ended_at":
                    ended = not row.stale and row.finish.ends
                    assert (got["ended_at"] is not None) == ended, row
                elif isinstance(want[column], tuple):  # a due time: now() + after
                    low, high = want[column]
                    assert low <= got[column] <= high + timedelta(seconds=1), (column, row)
                else:
                    assert got[column] == want[column], (column, row)

    @settings(
        max_examples=12,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(st.lists(ROWS, min_size=1, max_size=16))
    def check(rows: list[Row]) -> None:
        asyncio.run(run(rows))

    check()
