"""``outbox worker`` as a real process against the real Redis and PostgreSQL: its options work
after APP (and ``--`` hands the rest to dramatiq), and ``OUTBOX_LOG_FORMAT=json`` reaches every
process it starts (the dramatiq master, its worker processes and its metrics fork)."""

from __future__ import annotations

import json
import socket
import sys
from collections.abc import Iterator

import psycopg
import pytest

from outbox.dispatch.processes import WORKER_READY, OutboxProcess
from tests.apps import dispatch_app
from tests.dispatch_support import APP, REPO, DispatchRig

pytestmark = pytest.mark.slow

FAST = {
    "OUTBOX_POLL_INTERVAL_SECONDS": "0.2",
    "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "0.5",
}


@pytest.fixture
def rig(database_url: str, schema: str, redis_url: str) -> Iterator[DispatchRig]:
    rig = DispatchRig(database_url, schema, redis_url, dict(FAST))
    rig.outbox().migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        dispatch_app.create_tables(conn, schema)
    try:
        yield rig
    finally:
        list(rig.stop_all())
        for proc in rig.processes:
            proc.log_path.unlink(missing_ok=True)
        import redis

        client = redis.Redis.from_url(redis_url)
        for queue in rig.queues:
            for key in client.scan_iter(match=f"*{queue}*"):
                client.delete(key)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def outbox_worker(rig: DispatchRig, args: list[str], **env: str) -> OutboxProcess:
    proc = OutboxProcess([sys.executable, "-m", "outbox", "worker", *args], env, cwd=REPO)
    rig.processes.append(proc)
    return proc


def test_worker_options_after_app_are_the_outboxs_and_after_double_dash_dramatiqs(rig):
    # The schema, database and broker come from the options after APP only.
    env = rig.env()
    settings = {
        "--schema": env.pop("OUTBOX_SCHEMA"),
        "--database-url": env.pop("OUTBOX_DATABASE_URL"),
        "--broker-url": env.pop("OUTBOX_BROKER_URL"),
    }
    env = {**env, "OUTBOX_SCHEMA": "", "OUTBOX_DATABASE_URL": "", "OUTBOX_BROKER_URL": ""}
    args = [APP, *(x for pair in settings.items() for x in pair), "-p", "1", "-t", "2"]
    worker = outbox_worker(rig, [*args, "--", "--verbose"], **env)
    worker.wait_for(WORKER_READY, timeout=60)
    rig.claimer()
    ids = rig.enqueue(rig.rb, lanes=2, per_lane=2)
    rows = rig.wait_ended(ids, timeout=60)
    assert {r["state"] for r in rows} == {"DONE"}
    # --verbose reached dramatiq: its DEBUG lines are in the worker's output.
    assert "[DEBUG]" in worker.output()


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_json_log_format_reaches_the_master_every_worker_process_and_the_metrics_fork(rig, start):
    port = free_port()
    spawn = ["--", "--use-spawn"] if start == "spawn" else []
    worker = outbox_worker(
        rig,
        [APP, "--processes", "2", "--threads", "2", *spawn],
        **rig.env(OUTBOX_LOG_FORMAT="json", OUTBOX_METRICS_PORT=str(port)),
    )
    worker.wait_for(WORKER_READY, timeout=60, count=2)
    worker.wait_for("Fork process", timeout=30)
    rig.claimer()
    ids = rig.enqueue(rig.rb, lanes=4, per_lane=1)
    rig.wait_ended(ids, timeout=60)
    lines = [line for line in worker.output().splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except ValueError:
            pytest.fail(f"not a JSON line: {line!r}\n{worker.output()[-3000:]}")
    by_message = {}
    for line in parsed:
        by_message.setdefault(line["message"], set()).add(line["pid"])
    assert len(by_message[WORKER_READY]) == 2  # both worker processes
    assert any(m.startswith("Dramatiq") and "booting up" in m for m in by_message)  # master
    assert any(m.startswith("Fork process") for m in by_message)  # the metrics fork
    assert len({line["pid"] for line in parsed}) >= 4
