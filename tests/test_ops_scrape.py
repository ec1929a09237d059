"""A scrape of a running claimer and a running ``dramatiq`` worker (real processes, real Redis
and PostgreSQL) shows the counters with the contract's labels after a known mix of outcomes, and
the backlog gauges; either endpoint shows both processes (prometheus_client multiprocess mode)."""

from __future__ import annotations

import socket
import time
import urllib.request
from pathlib import Path

import psycopg
import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from outbox import ActionRequest
from outbox.dispatch.processes import start_claimer, start_worker
from tests.apps import metrics_app

pytestmark = pytest.mark.slow

APP = "tests.apps.metrics_app:make_outbox"
REPO = str(Path(__file__).resolve().parent.parent)
PLANS = {
    "done": ["done"],
    "done-2": ["done"],
    "failed": ["failed"],
    "uncertain": ["uncertain"],
    "cancelled": ["cancelled"],
    "retry-then-done": ["retry", "done"],
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def wait_for(predicate, timeout: float, what: str, logs) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except OSError:
            pass  # the endpoint is not up yet
        time.sleep(0.1)
    raise AssertionError(f"{what} not seen in {timeout}s\n{logs()}")


def test_scrape_of_running_claimer_and_worker_shows_counters_after_a_known_mix(
    database_url, schema, redis_url, tmp_path
):
    suffix = schema.upper()
    kind = metrics_app.kind(suffix)
    outbox = metrics_app.build(database_url, schema, suffix)
    outbox.migrate()
    prom_dir = tmp_path / "prometheus"
    prom_dir.mkdir()
    claimer_port, worker_port = free_port(), free_port()
    env = {
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_SCHEMA": schema,
        "OUTBOX_BROKER_URL": redis_url,
        "METRICS_APP_SUFFIX": suffix,
        "PYTHONPATH": REPO,
        "OUTBOX_POLL_INTERVAL_SECONDS": "0.2",
        "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "0.2",
        "PROMETHEUS_MULTIPROC_DIR": str(prom_dir),
        "dramatiq_prom_db": str(prom_dir),
    }
    processes = []
    try:
        worker = start_worker(
            APP, {**env, "OUTBOX_METRICS_PORT": str(worker_port)}, threads=4, cwd=REPO
        )
        processes.append(worker)
        claimer = start_claimer(APP, {**env, "OUTBOX_METRICS_PORT": str(claimer_port)}, cwd=REPO)
        processes.append(claimer)

        def logs() -> str:
            return "\n".join(f"--- {p.argv}\n{p.output()[-3000:]}" for p in processes)

        with psycopg.connect(database_url) as conn:
            for key, plan in PLANS.items():
                request = ActionRequest(
                    kind,
                    lane_key=key,
                    idempotency_key=key,
                    workspace_id="w",
                    payload={"plan": plan},
                )
                outbox.enqueue(conn, request)
            conn.commit()

        def label(**labels: str) -> tuple:
            return tuple(sorted({"kind": kind.name, **labels}.items()))

        def ended_total(samples) -> float:
            return sum(
                v
                for (name, labels), v in samples.items()
                if name == "outbox_action_ended_total" and dict(labels)["kind"] == kind.name
            )

        wait_for(lambda: ended_total(scrape(claimer_port)) == len(PLANS), 60, "6 ends", logs)

        # The gauges are refreshed by the claimer's housekeeping timer: wait for a refresh
        # that came after the last action ended (nothing due and nothing in flight).
        def settled() -> bool:
            samples = scrape(claimer_port) or {}
            return (
                samples.get(("outbox_actions_due", label())) == 0
                and samples.get(("outbox_actions_in_flight", label(queue=kind.queue_name))) == 0
            )

        wait_for(settled, 10, "due and in-flight gauges at 0", logs)
        wait_for(lambda: scrape(worker_port) is not None, 30, "the worker's endpoint", logs)

        for port in (claimer_port, worker_port):
            samples = scrape(port)
            attempts = "outbox_action_attempts_total"
            assert samples[(attempts, label(result="done", recorded="true"))] == 3
            assert samples[(attempts, label(result="retry", recorded="true"))] == 1
            for result in ("failed", "uncertain", "cancelled"):
                assert samples[(attempts, label(result=result, recorded="true"))] == 1
            ended = "outbox_action_ended_total"
            assert samples[(ended, label(state="DONE", reason="DONE"))] == 3
            assert samples[(ended, label(state="FAILED", reason="REJECTED"))] == 1
            assert samples[(ended, label(state="UNCERTAIN", reason="TIMEOUT"))] == 1
            assert samples[(ended, label(state="CANCELLED", reason="UNSUBSCRIBED"))] == 1
            assert ended_total(samples) == len(PLANS)
            assert samples[("outbox_actions_due", label())] == 0
            assert samples[("outbox_actions_in_flight", label(queue=kind.queue_name))] == 0
    finally:
        for proc in processes:
            proc.stop()
            proc.log_path.unlink(missing_ok=True)
        client = redis.Redis.from_url(redis_url)
        for key in client.scan_iter(match=f"*{kind.queue_name}*"):
            client.delete(key)
