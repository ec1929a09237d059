"""The console with real claimer and worker processes: /healthz and /processes name the live
ones, and a SIGKILLed worker drops out once its heartbeat is stale."""

from __future__ import annotations

import time
from collections.abc import Iterator

import httpx
import psycopg
import pytest
import redis
from dispatch_support import DispatchRig

from tests.apps import dispatch_app
from tests.console_support import running_console

pytestmark = pytest.mark.slow

FAST = {
    "OUTBOX_LEASE_SECONDS": "4",
    "OUTBOX_WRITE_MARGIN_SECONDS": "1",
    "OUTBOX_POLL_INTERVAL_SECONDS": "0.5",
    "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "0.5",
    "OUTBOX_HEARTBEAT_INTERVAL_SECONDS": "0.5",
    "OUTBOX_POOL_SIZE": "4",
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
        client = redis.Redis.from_url(redis_url)
        for name in rig.queues:
            for key in client.scan_iter(match=f"*{name}*"):
                client.delete(key)


def _until(check, timeout: float, what: str, rig: DispatchRig) -> dict:
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found is not None:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not within {timeout}s\n{rig.logs()}")
        time.sleep(0.3)


def test_healthz_and_the_processes_page_name_the_live_claimers_and_workers(
    rig: DispatchRig, monkeypatch
):
    # The console judges liveness by the same heartbeat interval as the processes.
    monkeypatch.setenv("OUTBOX_HEARTBEAT_INTERVAL_SECONDS", "0.5")
    worker = rig.worker(threads=2)
    claimer = rig.claimer()
    with (
        running_console(rig.database_url, rig.schema) as console,
        httpx.Client(base_url=console.url) as client,
    ):

        def both() -> dict | None:
            health = client.get("/healthz").json()
            return health if health["claimers"] == 1 and health["workers"] == 1 else None

        health = _until(both, 60, "a claimer and a worker on /healthz", rig)
        pids = {p["role"]: p["pid"] for p in health["processes"]}
        assert pids["claimer"] == claimer.popen.pid
        page = client.get("/processes/").text
        assert f'<td class="num">{claimer.popen.pid}</td>' in page
        worker.kill()

        def worker_gone() -> dict | None:
            health = client.get("/healthz").json()
            return health if health["workers"] == 0 else None

        health = _until(worker_gone, 30, "the killed worker dropping out", rig)
        assert health["claimers"] == 1 and health["status"] == "ok"
