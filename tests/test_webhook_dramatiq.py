"""Webhooks through the Dramatiq path: a real claimer process and a real ``dramatiq`` worker
pool deliver through ``WebhookAdapter`` to a receiver in this process that fails some requests
after taking them; every event is accepted once."""

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
from outbox.webhook import add_subscription, enqueue_webhook, new_secret, webhook_id
from tests.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.slow

APP = "tests.apps.webhook_app:make_outbox"
REPO = str(Path(__file__).resolve().parent.parent)
EVENTS = 60


@pytest.fixture
def processes(redis_url: str) -> Iterator[list[OutboxProcess]]:
    started: list[OutboxProcess] = []
    yield started
    for proc in started:
        proc.close()
    client = redis.Redis.from_url(redis_url)
    for key in client.scan_iter(match="*outbox.webhook*"):
        client.delete(key)


def test_webhooks_through_dramatiq_are_accepted_once_each_despite_lost_answers(
    database_url: str, schema: str, redis_url: str, processes: list[OutboxProcess]
) -> None:
    secret = new_secret()
    receivers = [WebhookReceiver([secret]).start() for _ in range(3)]
    try:
        for receiver in receivers:
            receiver.inject("500-after", times=2)
            receiver.inject("reset", times=1)
        Outbox(database_url, schema=schema).migrate()
        env = {
            "OUTBOX_DATABASE_URL": database_url,
            "OUTBOX_SCHEMA": schema,
            "OUTBOX_BROKER_URL": redis_url,
            "OUTBOX_LEASE_SECONDS": "60",
            "OUTBOX_WRITE_MARGIN_SECONDS": "15",
            "OUTBOX_POLL_INTERVAL_SECONDS": "0.2",
            "OUTBOX_RETRY_BASE_SECONDS": "0.1",
            "OUTBOX_RETRY_CAP_SECONDS": "0.5",
            "OUTBOX_WEBHOOK_ALLOW_PRIVATE": "127.0.0.0/8",
            "OUTBOX_WEBHOOK_TIMEOUT_SECONDS": "5",
            "PYTHONPATH": REPO,
        }
        processes.append(start_worker(APP, env, processes=1, threads=4, cwd=REPO))
        processes.append(start_claimer(APP, env, cwd=REPO))
        with psycopg.connect(database_url) as conn:
            for receiver in receivers:
                add_subscription(conn, receiver.url, [secret], ["order.created"], schema=schema)
            keys = [
                a.idempotency_key
                for n in range(EVENTS)
                for a in enqueue_webhook(
                    conn, "order.created", {"order": n}, idempotency_key=f"o{n}", schema=schema
                )
            ]
            conn.commit()
        expected = EVENTS * len(receivers)
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
                if sum(n for s, n in states.items() if s not in ("ADMITTED", "EXECUTING")) == (
                    expected
                ):
                    break
                assert time.monotonic() < deadline, f"{states}\n" + "\n".join(
                    p.output()[-3000:] for p in processes
                )
                time.sleep(0.2)
        assert states == {"DONE": expected}
        accepted = [msg_id for r in receivers for msg_id in r.accepted]
        assert sorted(accepted) == sorted(webhook_id(k) for k in keys)
        assert sum(len(r.posts()) for r in receivers) == expected + 3 * len(receivers)
        assert all(r.bad_signatures == 0 for r in receivers)
        # Each endpoint's deliveries arrived in enqueue order (one lane a subscription).
        for receiver in receivers:
            orders = [e["data"]["order"] for e in receiver.accepted.values()]
            assert orders == sorted(orders)
    finally:
        for receiver in receivers:
            receiver.stop()
