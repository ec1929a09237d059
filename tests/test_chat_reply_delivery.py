"""ChatReplyAdapter against a real local server speaking Slack's Web API shape, with faults
injected after the server wrote: the read-back (thread or channel, by the marker in the
message's metadata) settles every ambiguous failure, so each action leaves exactly one message."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from outbox import Action, ActionState, Outbox, get_action
from outbox.chat_reply import (
    CHAT_REPLY,
    ChatReplyAdapter,
    ChatReplySettings,
    enqueue_chat_reply,
    marker_of,
)
from outbox.results import Defer, Done, Retry
from outbox.testing import drain
from tests.slack_server import TOKEN, SlackServer

CHANNEL = "C0TEST"


@pytest.fixture
def slack() -> Iterator[SlackServer]:
    server = SlackServer().start()
    server.messages[CHANNEL] = []
    yield server
    server.stop()


@pytest.fixture
def outbox(make_outbox, slack: SlackServer) -> Outbox:
    ob = make_outbox()
    settings = ChatReplySettings(token=TOKEN, api_url=slack.url, timeout=timedelta(seconds=1))
    ob.register(CHAT_REPLY, ChatReplyAdapter(settings))
    ob.migrate()
    return ob


def reply(database_url, schema, thread_ts=None, key="ticket:1", channel=CHANNEL, **kw) -> int:
    with psycopg.connect(database_url) as conn:
        action = enqueue_chat_reply(
            conn,
            channel,
            "Deployed.",
            thread_ts=thread_ts,
            idempotency_key=key,
            workspace_id="acme",
            schema=schema,
            **kw,
        )
        conn.commit()
    return action.id


def action_of(database_url: str, schema: str, action_id: int) -> Action:
    with psycopg.connect(database_url) as conn:
        return get_action(conn, action_id, schema=schema)


def ours(slack: SlackServer, key: str = "ticket:1") -> list[dict]:
    return [
        m
        for m in slack.in_channel(CHANNEL)
        if (m.get("metadata") or {}).get("event_payload", {}).get("marker") == marker_of(key)
    ]


def test_a_reply_is_posted_once_with_its_marker_in_metadata(
    outbox, slack, database_url, schema
) -> None:
    parent = slack.post(CHANNEL, "Is it deployed?")
    action_id = reply(database_url, schema, thread_ts=parent["ts"])
    drain(outbox)
    (posted,) = ours(slack)
    assert posted["thread_ts"] == parent["ts"] and posted["metadata"]["event_type"] == "outbox"
    assert action_of(database_url, schema, action_id).readback_ref == f"{CHANNEL}:{posted['ts']}"


@pytest.mark.parametrize("threaded", [True, False], ids=["thread", "channel"])
@pytest.mark.parametrize("fault", ["timeout:2", "500-after", "reset"])
def test_an_ambiguous_failure_after_posting_is_settled_by_read_back_one_message(
    outbox, slack, database_url, schema, fault, threaded
) -> None:
    parent = slack.post(CHANNEL, "Is it deployed?")
    for n in range(450):  # more than two pages of 200 to read through
        slack.post(CHANNEL, f"chatter {n}", thread_ts=parent["ts"] if threaded else None)
    slack.inject(fault, method="POST")
    action_id = reply(database_url, schema, thread_ts=parent["ts"] if threaded else None)
    report = drain(outbox)
    (posted,) = ours(slack)  # exactly one message
    action = action_of(database_url, schema, action_id)
    assert action.state is ActionState.DONE
    assert action.readback_ref == f"{CHANNEL}:{posted['ts']}"
    assert [type(o.result) for o in report.outcomes] == [Retry, Done]
    reads = [r for r in slack.requests if r.method == "GET"]
    expected = "conversations.replies" if threaded else "conversations.history"
    assert {r.path.rsplit("/", 1)[-1] for r in reads} == {expected}
    assert all(r.query["include_all_metadata"] == "true" for r in reads)
    if threaded:
        assert len(reads) == 3  # the reply is the last of 452 messages: every page was read


@pytest.mark.parametrize(
    "fault",
    ["status:429:7", 'json:{"ok": false, "error": "ratelimited"}'],
    ids=["http-429", "ok-false-ratelimited"],
)
def test_a_rate_limit_defers_and_spends_no_attempt(outbox, slack, database_url, schema, fault):
    slack.inject(fault, method="POST")
    action_id = reply(database_url, schema)
    report = drain(outbox)
    deferred = report.outcomes[0].result
    assert isinstance(deferred, Defer) and deferred.reason == "SLACK_RATELIMITED"
    assert deferred.after == timedelta(seconds=7 if "429" in fault else 60)
    action = action_of(database_url, schema, action_id)
    assert (action.state, action.attempt) == (ActionState.DONE, 1)
    assert len(ours(slack)) == 1


def test_a_rate_limited_read_back_defers_then_finds_the_message(
    outbox, slack, database_url, schema
) -> None:
    slack.inject("500-after", method="POST")
    slack.inject("status:429:3", method="GET")
    action_id = reply(database_url, schema)
    report = drain(outbox)
    assert [type(o.result) for o in report.outcomes] == [Retry, Defer, Done]
    assert len(ours(slack)) == 1
    assert action_of(database_url, schema, action_id).state is ActionState.DONE


def test_a_read_back_without_access_ends_uncertain_never_a_second_message(
    outbox, slack, database_url, schema
) -> None:
    slack.inject("500-after", method="POST")
    slack.inject('json:{"ok": false, "error": "missing_scope"}', method="GET")
    action_id = reply(database_url, schema)
    drain(outbox)
    action = action_of(database_url, schema, action_id)
    assert (action.state, action.stop_reason) == (
        ActionState.UNCERTAIN,
        "SLACK_READBACK_MISSING_SCOPE",
    )
    assert len(ours(slack)) == 1


def test_a_refused_message_fails_with_the_error(outbox, slack, database_url, schema) -> None:
    action_id = reply(database_url, schema, channel="CGONE")
    drain(outbox)
    action = action_of(database_url, schema, action_id)
    assert (action.state, action.stop_reason) == (ActionState.FAILED, "SLACK_CHANNEL_NOT_FOUND")
