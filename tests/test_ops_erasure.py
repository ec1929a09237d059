"""Erasure: a pending action of the account vanishes and never runs; an attempt past its fence
still reaches the provider once and its late finish changes nothing (counted not recorded)."""

from __future__ import annotations

import asyncio
import json
import time

import psycopg
import pytest
from prometheus_client import REGISTRY

from outbox import (
    Abandoned,
    ActionAttempt,
    ActionKind,
    ActionRequest,
    Done,
    InvalidActionRequest,
    enqueue,
    erase_subject,
    erase_subject_async,
)
from outbox.cli import main
from outbox.testing import drain
from tests.support import Recorder, ScriptedAdapter, expected_lanes, lanes, rows

ERASE = ActionKind("ERASE_NOTE")


def put(conn, schema, key, account, lane=None, **fields):
    request = ActionRequest(
        ERASE,
        lane_key=lane or f"lane-{key}",
        idempotency_key=key,
        workspace_id="w",
        subject_account_id=account,
        payload={"note": key},
        **fields,
    )
    return enqueue(conn, request, schema=schema).id


def build(make_outbox, adapter):
    ob = make_outbox()
    ob.register(ERASE, adapter)
    ob.migrate()
    return ob


def attempts_sample(result: str, recorded: str) -> float:
    value = REGISTRY.get_sample_value(
        "outbox_action_attempts_total",
        {"kind": ERASE.name, "result": result, "recorded": recorded},
    )
    return value or 0.0


def test_erased_pending_actions_vanish_and_never_run(make_outbox, database_url, schema):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder))
    with psycopg.connect(database_url) as conn:
        gone = [
            put(conn, schema, "a1", "acc-1", lane="shared"),
            put(conn, schema, "a2", 1001),  # an integer account id is stored as text
            put(conn, schema, "a3", "acc-1", proposal=True),
        ]
        kept = put(conn, schema, "b1", "acc-2", lane="shared")  # behind an erased one
        conn.commit()
        report = erase_subject(conn, "acc-1", schema=schema)
        assert erase_subject(conn, 1001, schema=schema).erased == 1
        conn.commit()
        assert report.erased == 2
        assert report.by_state == {"ADMITTED": 1, "PROPOSED": 1}
        assert report.in_flight == 0

        drain(ob)
        assert dict(recorder.calls) == {kept: 1}
        assert [(r["id"], r["state"]) for r in rows(conn, schema)] == [(kept, "DONE")]
        assert not set(gone) & set(recorder.calls)
        assert lanes(conn, schema) == expected_lanes(conn, schema)


def test_erasure_is_part_of_the_callers_transaction(make_outbox, database_url, schema):
    recorder = Recorder()
    ob = build(make_outbox, ScriptedAdapter(recorder=recorder))
    with psycopg.connect(database_url) as conn, psycopg.connect(database_url) as other:
        action_id = put(conn, schema, "a1", "acc-1")
        conn.commit()
        assert erase_subject(conn, "acc-1", schema=schema).erased == 1
        assert len(rows(other, schema)) == 1  # not committed: others still see it
        conn.rollback()
        assert [r["id"] for r in rows(conn, schema)] == [action_id]
    drain(ob)
    assert dict(recorder.calls) == {action_id: 1}


def test_async_twin_erases_in_the_callers_transaction(make_outbox, database_url, schema):
    build(make_outbox, ScriptedAdapter())
    with psycopg.connect(database_url) as conn:
        put(conn, schema, "a1", "acc-9")
        conn.commit()

    async def erase():
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            report = await erase_subject_async(aconn, "acc-9", schema=schema)
            await aconn.commit()
            return report

    assert asyncio.run(erase()).by_state == {"ADMITTED": 1}
    with psycopg.connect(database_url) as conn:
        assert rows(conn, schema) == []


def test_erasure_needs_an_account(make_outbox, database_url, schema):
    build(make_outbox, ScriptedAdapter())
    with psycopg.connect(database_url) as conn, pytest.raises(InvalidActionRequest):
        erase_subject(conn, "", schema=schema)


class GatedAdapter:
    """Waits at a gate before (or after) its fence, so the test can erase in between; records
    every provider call."""

    def __init__(self, gate_after_fence: bool) -> None:
        self.gate_after_fence = gate_after_fence
        self.reached = asyncio.Event()
        self.release = asyncio.Event()
        self.provider_calls: list[int] = []

    async def execute(self, attempt: ActionAttempt):
        if not self.gate_after_fence:
            self.reached.set()
            await self.release.wait()
        if not await attempt.fence().begin_write():
            return Abandoned()
        if self.gate_after_fence:
            self.reached.set()
            await self.release.wait()
        self.provider_calls.append(attempt.id)  # the provider call
        return Done(f"sent-{attempt.id}")


async def run_with_erasure_at_gate(ob, database_url, schema, adapter):
    async with ob.store() as store:
        executor = ob.executor(store)
        claimed_at = time.monotonic()
        (claimed,) = await store.claim({ERASE.name: 1}, ob.settings.lease)
        task = asyncio.create_task(executor.run(claimed, claimed_at))
        await asyncio.wait_for(adapter.reached.wait(), 5)
        async with await psycopg.AsyncConnection.connect(database_url) as aconn:
            report = await erase_subject_async(aconn, "acc-1", schema=schema)
            await aconn.commit()
        adapter.release.set()
        return report, await asyncio.wait_for(task, 10)


def test_erased_after_its_fence_the_provider_is_called_once_and_the_finish_changes_nothing(
    make_outbox, database_url, schema
):
    adapter = GatedAdapter(gate_after_fence=True)
    ob = build(make_outbox, adapter)
    with psycopg.connect(database_url) as conn:
        action_id = put(conn, schema, "a1", "acc-1")
        conn.commit()
    before = attempts_sample("done", "false")

    report, outcome = asyncio.run(run_with_erasure_at_gate(ob, database_url, schema, adapter))

    assert report.in_flight == 1
    assert adapter.provider_calls == [action_id]
    assert outcome.result == Done(f"sent-{action_id}")
    assert outcome.recorded is False and outcome.state is None
    assert attempts_sample("done", "false") == before + 1
    with psycopg.connect(database_url) as conn:
        assert rows(conn, schema) == []
    assert drain(ob).attempts == 0
    assert adapter.provider_calls == [action_id]


def test_erased_before_its_fence_the_provider_is_never_called(make_outbox, database_url, schema):
    adapter = GatedAdapter(gate_after_fence=False)
    ob = build(make_outbox, adapter)
    with psycopg.connect(database_url) as conn:
        put(conn, schema, "a1", "acc-1")
        conn.commit()
    before = attempts_sample("abandoned", "false")

    report, outcome = asyncio.run(run_with_erasure_at_gate(ob, database_url, schema, adapter))

    assert report.by_state == {"EXECUTING": 1}
    assert adapter.provider_calls == []
    assert outcome.result == Abandoned() and outcome.recorded is False
    assert attempts_sample("abandoned", "false") == before + 1


def test_erase_cli_commits_and_reports(make_outbox, database_url, schema, capsys):
    build(make_outbox, ScriptedAdapter())
    with psycopg.connect(database_url) as conn:
        put(conn, schema, "a1", "acc-1")
        put(conn, schema, "a2", "acc-1", proposal=True)
        kept = put(conn, schema, "b1", "acc-2")
        conn.commit()
    args = ["erase", "--database-url", database_url, "--schema", schema, "--account", "acc-1"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "erased": 2,
        "by_state": {"ADMITTED": 1, "PROPOSED": 1},
    }
    with psycopg.connect(database_url) as conn:
        assert [r["id"] for r in rows(conn, schema)] == [kept]
    assert main(args) == 0
    assert "erased nothing" in capsys.readouterr().out
