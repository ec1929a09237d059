"""`outbox status` and `outbox inspect ID`: the numbers match the rows, for humans and --json."""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, Done, Failed, Retry, Uncertain, enqueue
from outbox.cli import main
from outbox.status import inspect, status
from tests.support import ScriptedAdapter

REPORTED = ActionKind("REPORTED")
RESULTS = {
    "ok": Done("ref-ok"),
    "bad-1": Failed("REJECTED"),
    "bad-2": Failed("NO_RECIPIENT"),
    "maybe": Uncertain("TIMEOUT"),
}


def put(conn, schema, key, lane=None, **fields):
    request = ActionRequest(
        REPORTED,
        lane_key=lane or f"lane-{key}",
        idempotency_key=key,
        workspace_id="w",
        payload={"ref": key},
        **fields,
    )
    return enqueue(conn, request, schema=schema).id


async def run_once(ob):
    async with ob.store() as store:
        return await ob.claim_and_run(ob.executor(store))


@pytest.fixture
def world(make_outbox, database_url, schema):
    """Four ended actions (DONE, 2 FAILED, UNCERTAIN), one proposal, and a lane whose head waits
    an hour for its retry with one action behind it."""

    def script(attempt):
        if attempt.idempotency_key == "retrying":
            return Retry(after=timedelta(hours=1))
        return RESULTS[attempt.idempotency_key]

    ob = make_outbox()
    ob.register(REPORTED, ScriptedAdapter(script))
    ob.migrate()
    ids = {}
    with psycopg.connect(database_url) as conn:
        for key in [*RESULTS, "retrying"]:
            ids[key] = put(conn, schema, key, lane="lane-r" if key == "retrying" else None)
        conn.commit()
        asyncio.run(run_once(ob))  # not drain: it would make the retry due again at once
        ids["behind"] = put(conn, schema, "behind", lane="lane-r")
        ids["proposal"] = put(conn, schema, "proposal", proposal=True)
        conn.commit()
    return ob, ids


def test_status_counts_every_state_and_lists_the_latest_uncertain_and_failed(
    world, database_url, schema
):
    _, ids = world
    with psycopg.connect(database_url) as conn:
        report = status(conn, schema=schema)
    assert report.counts[REPORTED.name] == {
        "ADMITTED": 2,
        "DONE": 1,
        "FAILED": 2,
        "PROPOSED": 1,
        "UNCERTAIN": 1,
    }
    assert report.counts["EMAIL"] == {}
    backlog = report.backlog[REPORTED.name]
    assert (backlog["due"], backlog["in_flight"], backlog["blocked_lanes"]) == (1, 0, 1)
    assert backlog["queue"] == "outbox.reported"
    assert [a["id"] for a in report.latest_uncertain] == [ids["maybe"]]
    assert report.latest_uncertain[0]["stop_reason"] == "TIMEOUT"
    assert {a["id"] for a in report.latest_failed} == {ids["bad-1"], ids["bad-2"]}
    assert all("payload" not in a for a in report.latest_failed + report.latest_uncertain)


def test_status_cli_json_matches_and_human_form_names_the_kinds(
    world, database_url, schema, capsys
):
    _, ids = world
    args = ["status", "--database-url", database_url, "--schema", schema]
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["counts"][REPORTED.name]["FAILED"] == 2
    assert data["backlog"][REPORTED.name]["blocked_lanes"] == 1
    assert data["latest_uncertain"][0]["id"] == ids["maybe"]
    assert main([*args, "--latest", "1"]) == 0
    text = capsys.readouterr().out
    assert REPORTED.name in text and f"#{ids['maybe']} REPORTED TIMEOUT" in text
    assert text.count("REPORTED REJECTED") + text.count("REPORTED NO_RECIPIENT") == 1


def test_inspect_shows_fields_lane_position_and_history(world, database_url, schema):
    _, ids = world
    with psycopg.connect(database_url) as conn:
        behind = inspect(conn, ids["behind"], schema=schema)
        retrying = inspect(conn, ids["retrying"], schema=schema)
        ended = inspect(conn, ids["maybe"], schema=schema)
        assert inspect(conn, 10**9, schema=schema) is None
    assert behind["action"]["state"] == "ADMITTED"
    assert behind["lane"] == {
        "lane_key": "lane-r",
        "head_id": ids["retrying"],
        "executing_id": None,
        "waiting_before": 1,
    }
    assert retrying["attempts"] == "1 of 5 (epoch 1)"
    assert [e["event"] for e in retrying["history"]] == ["created", "due"]
    assert ended["action"]["payload"] is None and ended["action"]["stop_reason"] == "TIMEOUT"
    assert [e["event"] for e in ended["history"]] == ["created", "write_started", "ended"]
    assert ended["history"][-1]["detail"] == "UNCERTAIN TIMEOUT"


def test_inspect_cli_prints_json_and_fails_for_a_missing_action(
    world, database_url, schema, capsys
):
    _, ids = world
    common = ["--database-url", database_url, "--schema", schema]
    assert main(["inspect", str(ids["bad-1"]), *common, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["action"]["id"], data["action"]["state"]) == (ids["bad-1"], "FAILED")
    assert main(["inspect", str(ids["proposal"]), *common]) == 0
    assert "PROPOSED" in capsys.readouterr().out
    assert main(["inspect", "999999999", *common]) == 1
    assert "no action 999999999" in capsys.readouterr().err
