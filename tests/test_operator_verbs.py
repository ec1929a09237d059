"""The operator's verbs on real PostgreSQL: resolve (and resend), retry, cancel, admit, refuse,
their bulk forms, and the audit they leave."""

from __future__ import annotations

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, Done, Failed, Uncertain, enqueue
from outbox.cli import main
from outbox.operator import (
    ActionFilter,
    BulkVerb,
    NothingToResend,
    OperatorRefused,
    Outcome,
    action_record,
    admit,
    bulk_apply,
    bulk_count,
    cancel,
    recent_audit,
    refuse,
    resolve,
    retry,
)
from outbox.testing import drain
from tests.support import ScriptedAdapter

NOTE = ActionKind("OPERATOR_NOTE", at_most_once=True)


def build(make_outbox, script):
    ob = make_outbox()
    ob.register(NOTE, ScriptedAdapter(script))
    ob.migrate()
    return ob


def put(conn, schema, key, *, proposal=False, lane=None):
    request = ActionRequest(
        NOTE,
        lane_key=lane or f"lane-{key}",
        idempotency_key=key,
        workspace_id="w",
        payload={"note": key},
        proposal=proposal,
    )
    action = enqueue(conn, request, schema=schema)
    conn.commit()
    return action.id


def by_key(script_by_key):
    return lambda attempt: script_by_key[attempt.idempotency_key]


@pytest.fixture
def auto(database_url):
    with psycopg.connect(database_url, autocommit=True) as connection:
        yield connection


def test_resolve_refuses_an_action_that_is_not_uncertain(make_outbox, conn, auto, schema):
    ob = build(make_outbox, lambda a: Done())
    done = put(conn, schema, "done")
    waiting = put(conn, schema, "waiting", proposal=True)
    drain(ob)
    for action_id, state in ((done, "DONE"), (waiting, "PROPOSED")):
        with pytest.raises(OperatorRefused, match=f"is {state}, not UNCERTAIN") as refused:
            resolve(auto, action_id, Outcome.DELIVERED, actor="ann", schema=schema)
        assert refused.value.state == state
    assert action_record(auto, done, schema=schema).resolution is None


def test_resolve_records_who_what_and_resend_is_made_once(make_outbox, conn, auto, schema):
    first = {"u1": Uncertain("SMTP_TIMEOUT_AFTER_DATA")}
    ob = build(make_outbox, lambda a: first.get(a.idempotency_key, Done("sent")))
    old = put(conn, schema, "u1")
    drain(ob)
    one = resolve(
        auto,
        old,
        Outcome.NOT_DELIVERED,
        actor="ann",
        note="not in relay log",
        resend=True,
        schema=schema,
    )
    two = resolve(auto, old, Outcome.NOT_DELIVERED, actor="bob", resend=True, schema=schema)
    assert one.created and not two.created
    assert one.resent is not None and two.resent is not None and one.resent.id == two.resent.id
    assert one.resolution.resolved_by == "ann" and one.resolution.note == "not in relay log"
    assert two.resolution == one.resolution
    new = one.resent
    assert (new.lane_key, new.kind, new.payload) == ("lane-u1", NOTE.name, {"note": "u1"})
    count = auto.execute(f'SELECT count(*) FROM "{schema}".agent_action').fetchone()[0]
    assert count == 2
    drain(ob)
    old_record = action_record(auto, old, schema=schema)
    new_record = action_record(auto, new.id, schema=schema)
    assert old_record.action.state == "UNCERTAIN"  # the ended row never changes
    assert [(x.from_id, x.to_id, x.relation) for x in old_record.later] == [(old, new.id, "RESEND")]
    assert [(x.from_id, x.to_id) for x in new_record.earlier] == [(old, new.id)]
    assert new_record.action.state == "DONE"
    assert not old_record.payload_parked  # the decision is taken: the payload is dropped
    with pytest.raises(OperatorRefused, match="already resolved NOT_DELIVERED by ann"):
        resolve(auto, old, Outcome.DELIVERED, actor="cid", schema=schema)
    audit = recent_audit(auto, action_id=old, schema=schema)
    assert [(a.actor, a.verb, a.outcome) for a in audit] == [
        ("bob", "resolve", "unchanged"),
        ("ann", "resolve", "applied"),
    ]


def test_retry_of_failed_and_cancelled_links_and_is_idempotent(make_outbox, conn, auto, schema):
    ob = build(
        make_outbox,
        lambda a: (
            Failed("SMTP_RCPT_550") if a.attempt == 1 and a.idempotency_key == "f" else Done()
        ),
    )
    failed = put(conn, schema, "f")
    waiting = put(conn, schema, "c", proposal=True)
    drain(ob)
    cancelled = cancel(auto, waiting, actor="ann", schema=schema)
    assert (cancelled.state, cancelled.stop_reason) == ("CANCELLED", "OPERATOR_CANCELLED")
    for old in (failed, waiting):
        new = retry(auto, old, actor="ann", schema=schema)
        again = retry(auto, old, actor="bob", schema=schema)
        assert new.id == again.id and new.payload == {"note": "f" if old == failed else "c"}
        assert action_record(auto, new.id, schema=schema).earlier[0].relation == "RETRY"
    drain(ob)
    done = auto.execute(
        f"SELECT count(*) FROM \"{schema}\".agent_action WHERE state = 'DONE'"
    ).fetchone()[0]
    assert done == 2
    live = put(conn, schema, "live")
    with pytest.raises(OperatorRefused, match="only a FAILED or CANCELLED"):
        retry(auto, live, actor="ann", schema=schema)


def test_retry_without_a_kept_payload_says_so(make_outbox, conn, auto, schema):
    ob = build(make_outbox, lambda a: Failed("NOPE"))
    old = put(conn, schema, "gone")
    drain(ob)
    auto.execute(f'DELETE FROM "{schema}".agent_action_parked_payload')
    with pytest.raises(NothingToResend, match="keeps no payload"):
        retry(auto, old, actor="ann", schema=schema)
    new = retry(auto, old, actor="ann", payload={"note": "again"}, schema=schema)
    assert new.payload == {"note": "again"}


def test_admit_and_refuse_proposals(make_outbox, conn, auto, schema):
    build(make_outbox, lambda a: Done())
    a = put(conn, schema, "pa", proposal=True)
    b = put(conn, schema, "pb", proposal=True)
    assert admit(auto, a, actor="ann", schema=schema).state == "ADMITTED"
    refused = refuse(auto, b, actor="ann", reason="NOT_NOW", schema=schema)
    assert (refused.state, refused.stop_reason) == ("CANCELLED", "NOT_NOW")
    with pytest.raises(OperatorRefused):
        admit(auto, a, actor="ann", schema=schema)
    with pytest.raises(OperatorRefused):
        cancel(auto, b, actor="ann", schema=schema)


def test_bulk_dry_run_counts_what_apply_changes(make_outbox, conn, auto, schema):
    outcomes = {f"u{i}": Uncertain("TIMEOUT") for i in range(5)}
    outcomes |= {f"f{i}": Failed("REFUSED_BY_PROVIDER") for i in range(3)}
    ob = build(make_outbox, lambda a: outcomes.get(a.idempotency_key, Done()))
    for key in outcomes:
        put(conn, schema, key)
    for i in range(4):
        put(conn, schema, f"w{i}", proposal=True)
    drain(ob)
    resolve(
        auto,
        action_record(auto, 1, schema=schema).action.id,
        Outcome.DELIVERED,
        actor="ann",
        schema=schema,
    )
    cases = [
        (BulkVerb.RESOLVE_DELIVERED, ActionFilter(kinds=(NOTE.name,)), 4),
        (BulkVerb.RETRY, ActionFilter(reasons=("REFUSED_BY_PROVIDER",)), 3),
        (BulkVerb.CANCEL, ActionFilter(states=("PROPOSED",), limit=3), 3),
        (BulkVerb.REFUSE, ActionFilter(kinds=(NOTE.name,)), 1),
    ]
    for verb, where, expected in cases:
        counted = bulk_count(auto, verb, where, schema=schema)
        result = bulk_apply(auto, verb, where, actor="ann", schema=schema)
        assert counted == result.matched == result.applied == expected, verb
        left = 1 if verb is BulkVerb.CANCEL else 0  # four proposals, a limit of three
        assert bulk_count(auto, verb, where, schema=schema) == left, verb
    bulk_rows = [a for a in recent_audit(auto, schema=schema) if a.verb.startswith("bulk-")]
    assert len(bulk_rows) == 4 and bulk_rows[0].detail["applied"] == 1


def test_cli_verbs_and_bulk_dry_run(make_outbox, conn, auto, schema, database_url, capsys):
    outcomes = {"u": Uncertain("TIMEOUT"), "f": Failed("NOPE")}
    ob = build(make_outbox, lambda a: outcomes.get(a.idempotency_key, Done()))
    u, f = put(conn, schema, "u"), put(conn, schema, "f")
    w = put(conn, schema, "w", proposal=True)
    drain(ob)
    base = ["--database-url", database_url, "--schema", schema, "--as", "oncall"]
    assert main(["resolve", str(f), "--delivered", *base]) == 1
    assert "is FAILED, not UNCERTAIN" in capsys.readouterr().err
    assert main(["resolve", str(u), "--not-delivered", "--resend", "--note", "n", *base]) == 0
    assert "resent as action" in capsys.readouterr().out
    assert main(["retry", str(f), *base]) == 0
    assert main(["cancel", "--state", "PROPOSED", "--dry-run", *base]) == 0
    assert "1 actions match for cancel" in capsys.readouterr().out
    assert action_record(auto, w, schema=schema).action.state == "PROPOSED"
    assert main(["cancel", "--state", "PROPOSED", "--yes", *base]) == 0
    assert "cancel: 1 of 1 applied" in capsys.readouterr().out
    assert main(["cancel", *base]) == 2  # neither an id nor a filter
    assert main(["pause", NOTE.name, "--note", "relay down", *base]) == 0
    assert main(["status", "--database-url", database_url, "--schema", schema]) == 0
    out = capsys.readouterr().out
    assert f"{NOTE.name} by oncall" in out and "relay down" in out
    assert main(["resume", NOTE.name, *base]) == 0
    assert main(["inspect", str(u), "--database-url", database_url, "--schema", schema]) == 0
    out = capsys.readouterr().out
    assert "resolved NOT_DELIVERED by oncall" in out and "RESEND as action" in out
    verbs = [a.verb for a in recent_audit(auto, schema=schema)]
    assert {"resolve", "retry", "cancel", "bulk-cancel", "pause", "resume"} <= set(verbs)
