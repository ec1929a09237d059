"""Email through the Dramatiq path: a real claimer process and a real ``dramatiq`` worker pool
send through ``EmailAdapter`` to an aiosmtpd relay in this process."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis

from outbox import Outbox
from outbox.dispatch.processes import OutboxProcess, start_claimer, start_worker
from outbox.email import SmtpSettings, enqueue_email, message_id_for
from tests.apps.email_app import NumberedNotice
from tests.email_sink import SmtpSink

pytestmark = pytest.mark.slow

APP = "tests.apps.email_app:make_outbox"
REPO = str(Path(__file__).resolve().parent.parent)
SENDER = "Load Test <noreply@load.example.com>"
EMAILS = 500


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    server = SmtpSink().start()
    yield server
    server.stop()


@pytest.fixture
def processes(redis_url: str) -> Iterator[list[OutboxProcess]]:
    started: list[OutboxProcess] = []
    yield started
    for proc in started:
        proc.close()
    # The EMAIL queue is shared by name: leave no message of this test for a later one.
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match="*outbox.email*"):
        client.delete(key)


def test_500_emails_through_dramatiq_reach_the_relay_once_each_with_distinct_message_ids(
    database_url: str,
    schema: str,
    redis_url: str,
    sink: SmtpSink,
    processes: list[OutboxProcess],
) -> None:
    Outbox(database_url, schema=schema).migrate()
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_SCHEMA": schema,
        "OUTBOX_BROKER_URL": redis_url,
        "OUTBOX_SMTP_URL": f"{sink.url}?timeout=10",
        "OUTBOX_SMTP_SENDER": SENDER,
        "OUTBOX_LEASE_SECONDS": "60",
        "OUTBOX_WRITE_MARGIN_SECONDS": "15",
        "OUTBOX_POLL_INTERVAL_SECONDS": "0.2",
        "PYTHONPATH": REPO,
    }
    processes.append(start_worker(APP, env, processes=1, threads=8, cwd=REPO))
    processes.append(start_claimer(APP, env, cwd=REPO))

    started = time.monotonic()
    notice = NumberedNotice()
    with psycopg.connect(database_url) as conn:
        keys = [
            enqueue_email(conn, notice, {"n": n}, schema=schema).idempotency_key
            for n in range(EMAILS)
        ]
        conn.commit()

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
            if sum(n for s, n in states.items() if s in ("DONE", "UNCERTAIN", "FAILED")) == EMAILS:
                break
            assert time.monotonic() < deadline, f"{states}\n" + "\n".join(
                p.output()[-3000:] for p in processes
            )
            time.sleep(0.2)
        attempts = conn.execute(
            f"SELECT max(attempt), count(*) FILTER (WHERE readback_ref LIKE %s) "
            f'FROM "{schema}".agent_action',
            ("<%.outbox@%>%",),
        ).fetchone()
    elapsed = time.monotonic() - started
    print(f"\n{EMAILS} emails via claimer + dramatiq worker to aiosmtpd: {elapsed:.1f}s")

    assert states == {"DONE": EMAILS}
    assert attempts == (1, EMAILS)  # each sent in one attempt, each with the relay's reply
    received = sink.accepted_ids()
    assert len(received) == EMAILS, "the relay got some email twice, or missed one"
    assert len(set(received)) == EMAILS
    sender = SmtpSettings.from_url(sink.url, SENDER).sender_address()
    assert set(received) == {message_id_for(key, sender) for key in keys}
    assert sorted(r.rcpt_tos[0] for r in sink.accepted) == sorted(
        f"user{n}@people.example.org" for n in range(EMAILS)
    )
