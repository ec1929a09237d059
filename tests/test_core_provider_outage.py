"""A kind's provider outage (``outbox.provider_outage``): once several distinct actions of a kind
retried with no DONE of it between, an attempt that would end FAILED ATTEMPTS_EXHAUSTED gives its
attempt back and waits instead, until a DONE of the kind ends the outage. One action retrying
alone, an adapter's exceptions, an outage past its limit or a threshold of 0 change nothing."""

from __future__ import annotations

import asyncio
import logging
import time
from datetime import timedelta

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from psycopg.rows import dict_row

from outbox import ActionKind, ActionRequest, ActionState, Done, Retry, StopReason, enqueue
from outbox._io import run_sync
from outbox.config import Settings
from outbox.errors import ConfigurationError
from outbox.fence_token import FenceToken
from outbox.operator.pausing import resume
from outbox.provider_outage import MAX_THRESHOLD, OutageRule, holds_called_for, outage_note
from outbox.queries import queries_for
from outbox.results import Finish
from outbox.status import render_status, status
from outbox.store import claim_operation, finishes_params
from tests.email_sink import SmtpSink, free_port
from tests.email_support import make_mail, run_one_round
from tests.support import ScriptedAdapter, rows

NOTE = ActionKind("NOTE")
DOWN = Retry(reason="PROVIDER_DOWN")


class Provider:
    """The script of a ScriptedAdapter: every attempt answers ``Retry`` while ``down``."""

    def __init__(self) -> None:
        self.down = True

    def __call__(self, attempt):
        return DOWN if self.down else Done(f"ref-{attempt.id}")


def build(make_outbox, script, **overrides):
    ob = make_outbox(retry_base=timedelta(seconds=0.01), **overrides)
    ob.register(NOTE, ScriptedAdapter(script))
    ob.migrate()
    return ob


def put(conn, schema: str, key: str, *, max_attempts: int = 1) -> int:
    request = ActionRequest(
        NOTE, lane_key=f"lane-{key}", idempotency_key=key, workspace_id="w",
        payload={"key": key}, max_attempts=max_attempts,
    )  # fmt: skip
    action = enqueue(conn, request, schema=schema)
    conn.commit()
    return action.id


def outage(conn, schema: str) -> tuple[bool, list[int]]:
    """(whether the kind's row has a start, its distinct retried actions)."""
    found = conn.execute(
        f'SELECT since IS NOT NULL, retried FROM "{schema}".agent_action_kind_outage'
        " WHERE kind = 'NOTE'"
    ).fetchone()
    conn.commit()
    return (False, []) if found is None else (found[0], list(found[1]))


def action(conn, schema: str, action_id: int) -> dict:
    found = rows(conn, schema, f"id = {action_id}")[0]
    conn.commit()
    return found


def run_until_idle(ob) -> None:
    """In-process rounds until nothing is due (waiting actions keep their time)."""

    async def rounds() -> None:
        async with ob.store() as store:
            await ob.run_until_idle(ob.executor(store))

    asyncio.run(rounds())


def history(conn, schema: str, action_id: int) -> list[str]:
    results = conn.execute(
        f'SELECT result FROM "{schema}".agent_action_attempt WHERE action_id = %s ORDER BY epoch',
        (action_id,),
    ).fetchall()
    conn.commit()
    return [r[0] for r in results]


def test_distinct_actions_that_retry_open_an_outage_that_gives_the_last_attempt_back(
    make_outbox, conn, schema
):
    provider = Provider()
    ob = build(make_outbox, provider, outage_threshold=3)
    first = [put(conn, schema, f"a{i}", max_attempts=5) for i in range(3)]
    run_one_round(ob)
    assert outage(conn, schema) == (True, sorted(first))

    last = put(conn, schema, "last", max_attempts=2)
    single = put(conn, schema, "single", max_attempts=1)
    run_one_round(ob)
    run_one_round(ob)  # its last attempt answers Retry while three others did: kept, not failed
    kept = action(conn, schema, last)
    assert (kept["state"], kept["attempt"], kept["stop_reason"]) == ("ADMITTED", 1, None)
    assert kept["retry_reason"] == "PROVIDER_DOWN"
    assert history(conn, schema, last) == ["RETRY", "RETRY"]
    # One attempt allowed is one attempt made, outage or not.
    ended = action(conn, schema, single)
    assert (ended["state"], ended["stop_reason"]) == ("FAILED", StopReason.ATTEMPTS_EXHAUSTED)

    provider.down = False
    run_one_round(ob)
    assert action(conn, schema, last)["state"] == "DONE"
    assert all(action(conn, schema, i)["state"] == "DONE" for i in first)
    assert outage(conn, schema) == (False, [])

    # The outage ended with the DONEs: a retry that runs out now fails as it always did.
    provider.down = True
    alone = put(conn, schema, "alone", max_attempts=2)
    run_one_round(ob)
    run_one_round(ob)
    ended = action(conn, schema, alone)
    assert (ended["state"], ended["stop_reason"]) == ("FAILED", StopReason.ATTEMPTS_EXHAUSTED)
    assert outage(conn, schema) == (True, [alone])


def test_one_action_retrying_alone_never_opens_an_outage(make_outbox, conn, schema):
    ob = build(make_outbox, Provider(), outage_threshold=2)
    alone = put(conn, schema, "alone", max_attempts=4)
    for _ in range(4):
        run_one_round(ob)
    ended = action(conn, schema, alone)
    assert (ended["state"], ended["attempt"]) == ("FAILED", 4)
    assert outage(conn, schema) == (True, [alone])


def test_an_adapters_exceptions_say_nothing_of_its_provider(make_outbox, conn, schema):
    def raising(attempt):
        raise RuntimeError("a bug that raises for every action")

    ob = build(make_outbox, raising, outage_threshold=2)
    ids = [put(conn, schema, f"e{i}") for i in range(4)]
    run_one_round(ob)
    assert [action(conn, schema, i)["state"] for i in ids] == ["FAILED"] * 4
    assert outage(conn, schema) == (False, [])


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"outage_threshold": 0}, id="threshold-0"),
        pytest.param({"outage_threshold": 2, "outage_limit": timedelta(seconds=1)}, id="limit"),
    ],
)
def test_an_outage_off_or_past_its_limit_gives_nothing_back(make_outbox, conn, schema, overrides):
    ob = build(make_outbox, Provider(), **overrides)
    first = [put(conn, schema, f"a{i}", max_attempts=5) for i in range(3)]
    run_one_round(ob)
    assert outage(conn, schema)[1] == first
    time.sleep(1.1)  # past the 1-s limit (the threshold-0 case waits for nothing)
    last = put(conn, schema, "last", max_attempts=2)
    run_one_round(ob)
    run_one_round(ob)
    ended = action(conn, schema, last)
    assert (ended["state"], ended["stop_reason"]) == ("FAILED", StopReason.ATTEMPTS_EXHAUSTED)


def test_status_shows_a_retrying_provider_and_whether_it_counts_as_down(make_outbox, conn, schema):
    ob = build(make_outbox, Provider(), outage_threshold=3)
    for i in range(2):
        put(conn, schema, f"a{i}", max_attempts=5)
    run_one_round(ob)
    report = status(conn, schema=schema)
    assert report.backlog["NOTE"]["retrying"] == 2
    assert "NOTE: 2 actions answered Retry" in render_status(report, OutageRule(threshold=3))
    assert "provider down" not in render_status(report, OutageRule(threshold=3))
    assert "provider down, its actions keep" in render_status(report, OutageRule(threshold=2))
    assert "provider down past" in render_status(
        report, OutageRule(threshold=2, limit=timedelta(0))
    )


def claim_round(ob) -> set[int]:
    """One claim-and-run round as a claimer's clock sees it (no backoff or hold cut short): the
    actions it ran."""

    async def round_() -> set[int]:
        async with ob.store() as store:
            return {o.action_id for o in await ob.claim_and_run(ob.executor(store))}

    return asyncio.run(round_())


def hold(conn, schema: str) -> tuple[float, int]:
    """(seconds until the kind's hold ends, 0 when not held; holds so far in its outage)."""
    found = conn.execute(
        "SELECT coalesce(greatest(extract(epoch FROM held_until - clock_timestamp()), 0),"
        " 0)::float8, holds"
        f' FROM "{schema}".agent_action_kind_outage WHERE kind = %s',
        (NOTE.name,),
    ).fetchone()
    conn.commit()
    return (0.0, 0) if found is None else (found[0], found[1])


def test_a_down_provider_holds_its_kind_so_its_actions_wait_without_calling_it(
    make_outbox, conn, schema, caplog
):
    provider = Provider()
    calls: list[int] = []

    def counted(attempt):
        calls.append(attempt.id)
        return provider(attempt)

    ob = build(make_outbox, counted, outage_threshold=2, outage_hold=timedelta(seconds=2))
    first = [put(conn, schema, f"a{i}", max_attempts=5) for i in range(2)]
    with caplog.at_level(logging.WARNING, logger="outbox"):
        assert claim_round(ob) == set(first)  # both answer Retry: down, so held
    held_for, holds = hold(conn, schema)
    assert 0 < held_for <= 2 and holds == 1
    (logged,) = [r for r in caplog.records if getattr(r, "event", "") == "provider_outage_held"]
    assert (logged.kind, logged.held_for_s) == (NOTE.name, 2.0)

    new = put(conn, schema, "new", max_attempts=5)
    time.sleep(0.05)  # the first two's backoff (0.01 s) is over: all three are due
    assert claim_round(ob) == set()
    assert calls == first and action(conn, schema, new)["attempt"] == 0
    assert history(conn, schema, new) == []
    text = render_status(status(conn, schema=schema), OutageRule(threshold=2))
    assert "provider down" in text and "claims hold it for another" in text

    time.sleep(held_for + 0.05)
    # The hold is over: one action probes the provider, and its retry holds the kind again.
    probe = claim_round(ob)
    assert len(probe) == 1 and len(calls) == 3
    held_for, holds = hold(conn, schema)
    assert 2 < held_for <= 4 and holds == 2  # twice the last

    provider.down = False
    end_hold(conn, schema)  # as if its 4 s went by
    assert "one action at a time probes" in render_status(
        status(conn, schema=schema), OutageRule(threshold=2)
    )
    conn.commit()
    probe = claim_round(ob)
    assert len(probe) == 1 and len(calls) == 4
    # Its DONE ended the outage and the hold: the others follow at once.
    assert outage(conn, schema) == (False, []) and hold(conn, schema) == (0.0, 0)
    assert claim_round(ob) == {*first, new} - probe
    assert {action(conn, schema, i)["state"] for i in (*first, new)} == {"DONE"}


def end_hold(conn, schema: str) -> None:
    conn.execute(
        f'UPDATE "{schema}".agent_action_kind_outage SET held_until = now() WHERE holds > 0'
    )
    conn.commit()


def test_after_a_hold_the_kind_is_claimed_one_action_at_a_time(make_outbox, conn, schema):
    """Between holds a claim takes one action of the kind, and none while one runs under a live
    lease: the probe. A lease that ran out does not block it (its reclaim is the probe)."""
    ob = build(make_outbox, Provider(), outage_threshold=2)
    ids = [put(conn, schema, f"p{i}", max_attempts=5) for i in range(3)]
    conn.execute(
        f'INSERT INTO "{schema}".agent_action_kind_outage (kind, since, retried, held_until,'
        " holds) VALUES ('NOTE', now(), %s, now() - interval '1 s', 1)",
        (ids[:2],),
    )
    conn.commit()

    async def claims(lease: timedelta) -> list[list[int]]:
        async with ob.store() as store:
            return [
                [c.action.id for c in await store.claim({NOTE.name: 10}, lease)] for _ in range(2)
            ]

    first, second = asyncio.run(claims(ob.settings.lease))
    assert len(first) == 1 and second == []
    conn.execute(
        f"UPDATE \"{schema}\".agent_action SET lease_until = now() WHERE state = 'EXECUTING'"
    )
    conn.commit()
    reclaimed, then = asyncio.run(claims(ob.settings.lease))
    assert reclaimed == first and then == []


def test_an_operators_resume_ends_a_hold_at_once(make_outbox, conn, schema):
    ob = build(make_outbox, Provider(), outage_threshold=2, outage_hold=timedelta(hours=1))
    ids = [put(conn, schema, f"r{i}", max_attempts=5) for i in range(3)]
    assert len(claim_round(ob)) == 3  # all retry: held for an hour
    assert hold(conn, schema)[1] == 1 and claim_round(ob) == set()
    assert resume(conn, NOTE.name, actor="test", schema=schema)
    assert hold(conn, schema) == (0.0, 0)
    time.sleep(0.05)  # their backoff (0.01 s) is over
    assert claim_round(ob) == set(ids)  # claimed at once, not one at a time; held again
    assert hold(conn, schema)[1] == 1
    assert not resume(conn, "OTHER", actor="test", schema=schema)


def test_a_hold_past_the_outage_limit_is_released():
    rule = OutageRule(threshold=2, limit=timedelta(seconds=60), hold=timedelta(seconds=5))
    row = {"kind": "K", "actions": 3, "retrying_for": 10.0, "held": None, "holds": 0}
    assert holds_called_for([row], rule)["fors"] == [timedelta(seconds=5)]
    assert holds_called_for([{**row, "holds": 2}], rule)["fors"] == [timedelta(seconds=20)]
    assert holds_called_for([{**row, "held": True}], rule) is None
    past = {**row, "retrying_for": 61.0}
    assert holds_called_for([past], rule) is None  # never held: nothing to release
    assert holds_called_for([{**past, "holds": 3}], rule)["fors"] == [None]
    assert holds_called_for([row], OutageRule(threshold=2, hold=timedelta(0))) is None


def test_without_a_hold_a_down_providers_kind_is_claimed_as_before(make_outbox, conn, schema):
    ob = build(make_outbox, Provider(), outage_threshold=2, outage_hold=timedelta(0))
    first = [put(conn, schema, f"a{i}", max_attempts=5) for i in range(2)]
    claim_round(ob)
    new = put(conn, schema, "new", max_attempts=5)
    time.sleep(0.05)
    assert claim_round(ob) == {*first, new}
    assert hold(conn, schema) == (0.0, 0)


def test_the_hold_doubles_up_to_its_ceiling():
    rule = OutageRule(hold=timedelta(seconds=5))
    assert [rule.hold_for(n).total_seconds() for n in range(6)] == [5, 10, 20, 40, 60, 60]
    assert OutageRule(hold=timedelta(seconds=0.5)).hold_for(9) == timedelta(seconds=6)
    assert OutageRule(hold=timedelta(0)).hold_for(3) == timedelta(0)


def test_a_claim_round_of_a_claimer_skips_a_held_kind_as_a_paused_one(make_outbox, conn, schema):
    build(make_outbox, Provider())
    state = queries_for(schema)["claim_round_state"]
    params = {"limit": 10, "kinds": [NOTE.name]}
    assert conn.execute(state, params).fetchone()[1] == []
    conn.execute(
        f'INSERT INTO "{schema}".agent_action_kind_outage (kind, since, retried, held_until,'
        " holds) VALUES ('NOTE', now(), '{1, 2}', now() + interval '1 hour', 1)"
    )
    assert conn.execute(state, params).fetchone()[1] == [NOTE.name]
    conn.execute(
        f"UPDATE \"{schema}\".agent_action_kind_outage SET held_until = now() - interval '1 s'"
    )
    assert conn.execute(state, params).fetchone()[1] == []
    conn.rollback()


@pytest.mark.parametrize("threshold", [1, MAX_THRESHOLD + 1, -1])
def test_a_threshold_outside_its_range_is_refused(threshold):
    with pytest.raises(ConfigurationError, match="OUTBOX_OUTAGE_THRESHOLD"):
        Settings(outage_threshold=threshold)


# -- the row a finish statement keeps, over any sequence of finishes ------------------------------

ACTIONS = 20
LEASE = timedelta(minutes=5)
#: One finish statement: for each action it names, True for a DONE, False for a Retry; the
#: other live actions claimed with it defer (neither counts).
STEPS = st.lists(
    # A DONE one pick in eight, so that runs of retries reach the row's cap of 16.
    st.dictionaries(
        st.integers(0, ACTIONS - 1),
        st.integers(0, 7).map(lambda n: n == 0),
        min_size=1,
        max_size=6,
    ),
    min_size=1,
    max_size=12,
)


def _finish(token: FenceToken, done: bool | None) -> tuple:
    if done is None:
        finish = Finish(ActionState.ADMITTED, after=timedelta(0), gives_back_attempt=True)
    elif done:
        finish = Finish(ActionState.DONE, StopReason.DONE)
    else:
        finish = Finish(ActionState.ADMITTED, after=timedelta(0), retried=True)
    return (token, finish, None, False, None)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(steps=STEPS)
def test_the_outage_row_holds_the_distinct_actions_retried_since_the_last_done(
    make_outbox, database_url, schema, steps
):
    ob = make_outbox()
    ob.register(NOTE, ScriptedAdapter())
    ob.migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f"UPDATE \"{schema}\".agent_action_kind_outage SET since = NULL, retried = '{{}}'"
        )
        run = f"{time.monotonic_ns()}"
        ids = [put(conn, schema, f"{run}-{i}", max_attempts=1000) for i in range(ACTIONS)]
        ended: set[int] = set()
        expected: list[int] = []
        for step in steps:
            # Every live action is claimed (an earlier example's too: it defers).
            claimed = run_sync(conn, claim_operation(schema, {"NOTE": 1000}, LEASE, take=True))
            chosen = {ids[i]: done for i, done in step.items() if ids[i] not in ended}
            finishes = [
                _finish(FenceToken(c.action.id, c.action.epoch), chosen.get(c.action.id))
                for c in claimed
            ]
            written = {
                row["id"]: row
                for row in conn.cursor(row_factory=dict_row)
                .execute(queries_for(schema)["finish_many"], finishes_params(finishes))
                .fetchall()
            }
            assert len(written) == len(claimed)
            # As Store writes them: the note the finish statement's rows call for, if any.
            note = outage_note(
                (token.action_id, finish, written[token.action_id]["outage_kind"])
                for token, finish, *_ in finishes
            )
            if note is not None:
                conn.execute(queries_for(schema)["provider_outage_note"], note)
            assert len({c.action.id for c in claimed} & set(ids)) == ACTIONS - len(ended)
            # A DONE empties a row that holds retries, and its statement's retries do not
            # count; beside an empty row (the finish does not name the DONE's kind) they do.
            if expected and any(chosen.values()):
                expected = []
            else:
                retried = sorted(i for i, done in chosen.items() if not done)
                expected += [i for i in retried if i not in expected]
            ended |= {i for i, done in chosen.items() if done}
            assert outage(conn, schema) == (bool(expected), expected[:MAX_THRESHOLD])


# -- a real relay, down for longer than the emails' retry budget ---------------------------------

RELAY_DOWN_S = 3.0


@pytest.mark.parametrize(
    "threshold", [pytest.param(3, id="outage-rides"), pytest.param(0, id="outage-off")]
)
def test_emails_ride_out_a_relay_outage_longer_than_their_retry_budget(
    make_outbox, database_url, schema, threshold
):
    """Six emails meet a relay that refuses connections for 3 s, where their 5 attempts back off
    0.05 s x (1 + 2 + 4 + 8) x 0.5..1 (at most 0.75 s) in all. With the outage on, every one is
    sent once the relay is back, exactly once; with it off, every one fails."""
    port = free_port()
    mail = make_mail(
        lambda: make_outbox(retry_base=timedelta(seconds=0.05), outage_threshold=threshold),
        database_url, schema, f"smtp://127.0.0.1:{port}?timeout=1",
    )  # fmt: skip
    ids = [mail.enqueue(idempotency_key=f"rides-{i}", lane_key=f"rides-{i}") for i in range(6)]
    sink = SmtpSink()
    started = time.monotonic()
    try:
        with psycopg.connect(database_url, autocommit=True) as conn:
            while time.monotonic() - started < 20:
                if sink.port == 0 and time.monotonic() - started > RELAY_DOWN_S:
                    sink.start(port)
                run_until_idle(mail.outbox)  # what is due now, no sooner: real backoffs
                states = [action(conn, schema, i)["state"] for i in ids]
                if all(s in ("DONE", "FAILED") for s in states):
                    break
                time.sleep(0.02)
    finally:
        sink.stop()
    if threshold:
        assert states == ["DONE"] * 6
        assert len(sink.accepted_ids()) == 6 == len(set(sink.accepted_ids()))
    else:
        assert states == ["FAILED"] * 6
        assert sink.accepted_ids() == []


def test_a_finish_stands_when_its_outage_note_is_refused(make_outbox, conn, schema, caplog):
    """The note is written after the finishes, in a statement of its own: the database refusing
    it (here a trigger that raises) loses a count, never an attempt's result."""
    ob = build(make_outbox, Provider(), outage_threshold=2)
    conn.execute(
        f'CREATE FUNCTION "{schema}".refuse() RETURNS trigger LANGUAGE plpgsql AS'
        " $$ BEGIN RAISE EXCEPTION 'refused'; END $$;"
        f' CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON "{schema}".agent_action_kind_outage'
        f' FOR EACH ROW EXECUTE FUNCTION "{schema}".refuse()'
    )
    conn.commit()
    first = put(conn, schema, "a", max_attempts=3)
    with caplog.at_level("WARNING", logger="outbox.store"):
        outcomes = run_one_round(ob)
    assert [(o.action_id, o.recorded) for o in outcomes] == [(first, True)]
    written = action(conn, schema, first)
    assert (written["state"], written["attempt"]) == ("ADMITTED", 1)
    assert outage(conn, schema) == (False, [])
    assert any(r.__dict__.get("event") == "provider_outage_note_failed" for r in caplog.records)
