"""IssueCommentAdapter against a real local server speaking GitHub's REST shape, with faults
injected after the server wrote: every ambiguous failure is settled by reading the comments
back, so the issue holds exactly one comment per action and no action ends UNCERTAIN unless the
read-back itself cannot answer."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from outbox import Action, ActionState, Outbox, get_action
from outbox.issue_comment import (
    ISSUE_COMMENT,
    IssueCommentAdapter,
    IssueCommentSettings,
    enqueue_issue_comment,
    marker_of,
)
from outbox.results import Defer, Done, Retry, Uncertain
from outbox.testing import drain
from tests.github_server import TOKEN, GitHubServer

OWNER, REPO, ISSUE = "acme", "shop", 7


@pytest.fixture
def github() -> Iterator[GitHubServer]:
    server = GitHubServer().start()
    yield server
    server.stop()


@pytest.fixture
def outbox(make_outbox, github: GitHubServer) -> Outbox:
    ob = make_outbox()
    settings = IssueCommentSettings(token=TOKEN, api_url=github.url, timeout=timedelta(seconds=1))
    ob.register(ISSUE_COMMENT, IssueCommentAdapter(settings))
    ob.migrate()
    return ob


def comment(database_url: str, schema: str, key: str = "feedback:1", max_attempts: int = 8) -> int:
    with psycopg.connect(database_url) as conn:
        action = enqueue_issue_comment(
            conn,
            OWNER,
            REPO,
            ISSUE,
            "Thanks, we are on it.",
            idempotency_key=key,
            workspace_id="acme",
            max_attempts=max_attempts,
            schema=schema,
        )
        conn.commit()
    return action.id


def action_of(database_url: str, schema: str, action_id: int) -> Action:
    with psycopg.connect(database_url) as conn:
        return get_action(conn, action_id, schema=schema)


def test_a_comment_is_posted_once_with_its_hidden_marker_and_done_with_its_id(
    outbox, github, database_url, schema
) -> None:
    action_id = comment(database_url, schema)
    report = drain(outbox)
    action = action_of(database_url, schema, action_id)
    (posted,) = github.on(OWNER, REPO, ISSUE)
    assert action.state is ActionState.DONE
    assert action.readback_ref == str(posted["id"])
    assert posted["body"] == f"Thanks, we are on it.\n\n{marker_of('feedback:1')}"
    assert github.gets() == []  # a first attempt has nothing to read back
    assert [type(o.result) for o in report.outcomes] == [Done]


@pytest.mark.parametrize("fault", ["timeout:2", "500-after", "reset"])
def test_an_ambiguous_failure_after_posting_is_settled_by_read_back_one_comment(
    outbox, github, database_url, schema, fault
) -> None:
    github.inject(fault, method="POST")
    action_id = comment(database_url, schema)
    report = drain(outbox)
    action = action_of(database_url, schema, action_id)
    (posted,) = github.on(OWNER, REPO, ISSUE)  # exactly one comment
    assert action.state is ActionState.DONE
    assert action.readback_ref == str(posted["id"])
    assert [type(o.result) for o in report.outcomes] == [Retry, Done]
    assert len(github.gets()) == 1 and github.gets()[0].query["per_page"] == "100"


def test_the_read_back_follows_every_page(outbox, github, database_url, schema) -> None:
    github.add_comments(OWNER, REPO, ISSUE, [f"older comment {n}" for n in range(250)])
    github.inject("500-after", method="POST")
    action_id = comment(database_url, schema)
    drain(outbox)
    action = action_of(database_url, schema, action_id)
    ours = [c for c in github.on(OWNER, REPO, ISSUE) if marker_of("feedback:1") in c["body"]]
    assert len(ours) == 1 and action.readback_ref == str(ours[0]["id"])
    assert [r.query.get("page", "1") for r in github.gets()] == ["1", "2", "3"]


@pytest.mark.parametrize(
    ("fault", "wait", "reason"),
    [
        ("status:429:7", 7, "GITHUB_RATE_LIMITED_429"),
        ("status:403:5", 5, "GITHUB_RATE_LIMITED_403"),
        ("ratelimited:30", 30, "GITHUB_RATE_LIMITED_403"),
    ],
)
def test_a_rate_limit_defers_and_spends_no_attempt(
    outbox, github, database_url, schema, fault, wait, reason
) -> None:
    github.inject(fault, method="POST")
    action_id = comment(database_url, schema)
    report = drain(outbox)
    deferred = report.outcomes[0].result
    assert isinstance(deferred, Defer) and deferred.reason == reason
    assert abs(deferred.after - timedelta(seconds=wait)) <= timedelta(seconds=2)
    action = action_of(database_url, schema, action_id)
    assert (action.state, action.attempt) == (ActionState.DONE, 1)
    assert len(github.on(OWNER, REPO, ISSUE)) == 1


def test_a_rate_limited_read_back_defers_then_finds_the_comment(
    outbox, github, database_url, schema
) -> None:
    github.inject("500-after", method="POST")
    github.inject("ratelimited:10", method="GET")
    action_id = comment(database_url, schema)
    report = drain(outbox)
    assert [type(o.result) for o in report.outcomes] == [Retry, Defer, Done]
    assert len(github.on(OWNER, REPO, ISSUE)) == 1
    assert action_of(database_url, schema, action_id).state is ActionState.DONE


def test_a_read_back_that_cannot_answer_ends_uncertain_never_a_second_comment(
    outbox, github, database_url, schema
) -> None:
    github.inject("500-after", method="POST")
    github.inject("status:403", method="GET")  # no rate limit headers: access was lost
    action_id = comment(database_url, schema)
    drain(outbox)
    action = action_of(database_url, schema, action_id)
    assert (action.state, action.stop_reason) == (
        ActionState.UNCERTAIN,
        "GITHUB_READBACK_HTTP_403",
    )
    assert len(github.on(OWNER, REPO, ISSUE)) == 1


def test_a_read_back_failing_on_the_last_attempt_ends_uncertain(
    outbox, github, database_url, schema
) -> None:
    github.inject("500-after", method="POST")
    github.inject("status:502", method="GET", times=5)
    action_id = comment(database_url, schema, max_attempts=3)
    report = drain(outbox)
    assert isinstance(report.outcomes[-1].result, Uncertain)
    action = action_of(database_url, schema, action_id)
    assert (action.state, action.stop_reason) == (
        ActionState.UNCERTAIN,
        "GITHUB_READBACK_HTTP_502",
    )
    assert len(github.on(OWNER, REPO, ISSUE)) == 1


def test_a_refused_comment_fails_with_the_status(outbox, github, database_url, schema) -> None:
    github.inject("status:422", method="POST")
    action_id = comment(database_url, schema)
    drain(outbox)
    action = action_of(database_url, schema, action_id)
    assert (action.state, action.stop_reason) == (ActionState.FAILED, "GITHUB_HTTP_422")
