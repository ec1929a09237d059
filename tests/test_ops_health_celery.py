"""A Celery worker's health file, read as ``outbox health --role worker`` reads it: ready while
its consumer holds a broker connection, live but unready while the broker is gone (a private
Redis), not live while the process is stopped (SIGSTOP), and ready again after each."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from dispatch_support import REPO

from benchmarks.chaos.servers import PrivateRedis
from outbox.dispatch.processes import start_celery_worker
from tests.test_ops_health import APP, STALE, eventually, health_rig, live, probe, ready

pytestmark = pytest.mark.slow


def test_a_celery_worker_is_ready_while_it_consumes_and_live_while_it_runs(
    database_url: str, schema: str, tmp_path: Path
) -> None:
    with PrivateRedis() as broker, health_rig(database_url, schema, broker.url, tmp_path) as rig:
        env = {
            **rig.env(OUTBOX_FABRIC="celery", OUTBOX_HEALTH_DIR=str(tmp_path)),
            "OUTBOX_APP": APP,
        }
        worker = start_celery_worker(env, queues=rig.queues, cwd=REPO, wait=False)
        rig.processes.append(worker)
        worker.wait_for(" ready.", timeout=60)
        eventually(lambda: ready(tmp_path, "worker"), "celery worker ready", rig)
        (health_file,) = tmp_path.glob("worker-*.json")
        pid = int(health_file.stem.split("-")[1])

        broker.stop()
        eventually(lambda: not ready(tmp_path, "worker"), "celery worker unready", rig)
        code, out = probe(tmp_path, "worker")
        assert code == 1 and "broker" in out, out
        time.sleep(float(STALE) + 1)  # the consumer reconnects meanwhile: still live
        assert live(tmp_path, "worker"), probe(tmp_path, "worker", live=True)
        broker.start()
        eventually(lambda: ready(tmp_path, "worker"), "celery worker ready again", rig)

        os.kill(pid, signal.SIGSTOP)
        try:
            eventually(lambda: not live(tmp_path, "worker"), "stopped worker not live", rig)
        finally:
            os.kill(pid, signal.SIGCONT)
        eventually(lambda: ready(tmp_path, "worker"), "celery worker ready after SIGCONT", rig)
