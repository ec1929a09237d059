"""Read-back kinds through the Dramatiq path: a real claimer process and a real ``dramatiq``
worker pool post to a local API server in this process that fails some posts after writing;
the read-back settles each, so every action leaves exactly one write."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from outbox import Outbox
from outbox.chat_reply import enqueue_chat_reply
from outbox.chat_reply import marker_of as chat_marker
from outbox.dispatch.processes import OutboxProcess, start_claimer, start_worker
from outbox.issue_comment import enqueue_issue_comment, marker_of
from tests.github_server import TOKEN, GitHubServer
from tests.slack_server import TOKEN as SLACK_TOKEN
from tests.slack_server import SlackServer

pytestmark = pytest.mark.slow

APP = "tests.apps.readback_app:make_outbox"
REPO = str(Path(__file__).resolve().parent.parent)


@pytest.fixture
def processes(redis_url: str) -> Iterator[list[OutboxProcess]]:
    started: list[OutboxProcess] = []
    yield started
    for proc in started:
        proc.close()
    client = redis.Redis.from_url(redis_url)
    for pattern in ("*outbox.issue_comment*", "*outbox.chat_reply*"):
        for key in client.scan_iter(match=pattern):
            client.delete(key)


def base_env(database_url: str, schema: str, redis_url: str) -> dict[str, str]:
    return {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_SCHEMA": schema,
        "OUTBOX_BROKER_URL": redis_url,
        "OUTBOX_LEASE_SECONDS": "60",
        "OUTBOX_WRITE_MARGIN_SECONDS": "15",
        "OUTBOX_POLL_INTERVAL_SECONDS": "0.2",
        "OUTBOX_RETRY_BASE_SECONDS": "0.1",
        "OUTBOX_RETRY_CAP_SECONDS": "0.5",
        "PYTHONPATH": REPO,
    }


def wait_until_ended(database_url: str, schema: str, total: int, processes) -> Counter:
    deadline = time.monotonic() + 120
    with psycopg.connect(database_url, autocommit=True) as conn:
        while True:
            states = Counter(
                dict(
                    conn.execute(
                        f'SELECT state, count(*) FROM "{schema}".agent_action GROUP BY state'
                    ).fetchall()
                )
            )
            if sum(n for s, n in states.items() if s not in ("ADMITTED", "EXECUTING")) == total:
                return states
            assert time.monotonic() < deadline, f"{states}\n" + "\n".join(
                p.output()[-3000:] for p in processes
            )
            time.sleep(0.2)


def test_issue_comments_through_dramatiq_leave_one_comment_each_despite_lost_answers(
    database_url: str, schema: str, redis_url: str, processes: list[OutboxProcess]
) -> None:
    github = GitHubServer().start()
    try:
        github.inject("500-after", method="POST", times=3)
        github.inject("reset", method="POST", times=2)
        github.inject("timeout:6", method="POST", times=1)
        Outbox(database_url, schema=schema).migrate()
        env = {
            **base_env(database_url, schema, redis_url),
            "OUTBOX_GITHUB_TOKEN": TOKEN,
            "OUTBOX_GITHUB_API_URL": github.url,
            "OUTBOX_GITHUB_TIMEOUT_SECONDS": "5",
        }
        processes.append(start_worker(APP, env, processes=1, threads=4, cwd=REPO))
        processes.append(start_claimer(APP, env, cwd=REPO))
        issues, per_issue = 6, 5
        keys = []
        with psycopg.connect(database_url) as conn:
            for issue in range(1, issues + 1):
                for n in range(per_issue):
                    action = enqueue_issue_comment(
                        conn,
                        "acme",
                        "shop",
                        issue,
                        f"update {n}",
                        idempotency_key=f"i{issue}:{n}",
                        workspace_id="acme",
                        schema=schema,
                    )
                    keys.append(action.idempotency_key)
            conn.commit()
        states = wait_until_ended(database_url, schema, issues * per_issue, processes)
        assert states == {"DONE": issues * per_issue}
        for issue in range(1, issues + 1):
            bodies = [c["body"] for c in github.on("acme", "shop", issue)]
            # Exactly one comment per action, in the lane's order.
            assert [b.split("\n")[0] for b in bodies] == [f"update {n}" for n in range(per_issue)]
            assert [b.split("\n")[-1] for b in bodies] == [
                marker_of(f"i{issue}:{n}") for n in range(per_issue)
            ]
    finally:
        github.stop()


def test_chat_replies_through_dramatiq_leave_one_message_each_despite_lost_answers(
    database_url: str, schema: str, redis_url: str, processes: list[OutboxProcess]
) -> None:
    slack = SlackServer().start()
    try:
        channels = ["C1", "C2", "C3"]
        parents = {c: slack.post(c, "thread start")["ts"] for c in channels}
        slack.inject("500-after", method="POST", times=3)
        slack.inject("reset", method="POST", times=2)
        slack.inject("timeout:6", method="POST", times=1)
        Outbox(database_url, schema=schema).migrate()
        env = {
            **base_env(database_url, schema, redis_url),
            "OUTBOX_SLACK_TOKEN": SLACK_TOKEN,
            "OUTBOX_SLACK_API_URL": slack.url,
            "OUTBOX_SLACK_TIMEOUT_SECONDS": "5",
        }
        processes.append(start_worker(APP, env, processes=1, threads=4, cwd=REPO))
        processes.append(start_claimer(APP, env, cwd=REPO))
        per_channel = 8
        with psycopg.connect(database_url) as conn:
            for channel in channels:
                for n in range(per_channel):
                    enqueue_chat_reply(
                        conn,
                        channel,
                        f"step {n}",
                        thread_ts=parents[channel] if n % 2 else None,
                        idempotency_key=f"{channel}:{n}",
                        workspace_id="acme",
                        schema=schema,
                    )
            conn.commit()
        states = wait_until_ended(database_url, schema, len(channels) * per_channel, processes)
        assert states == {"DONE": len(channels) * per_channel}
        for channel in channels:
            posted = [m for m in slack.in_channel(channel) if m.get("metadata")]
            # Exactly one message per action, in the lane's order.
            assert [m["text"] for m in posted] == [f"step {n}" for n in range(per_channel)]
            assert [m["metadata"]["event_payload"]["marker"] for m in posted] == [
                chat_marker(f"{channel}:{n}") for n in range(per_channel)
            ]
    finally:
        slack.stop()
