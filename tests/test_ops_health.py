"""Liveness and readiness of the claimer and the worker pool, with real processes made unhealthy
and healthy again: the broker gone (a private Redis), PostgreSQL gone (a private server), a
worker process stopped (SIGSTOP). Each verdict is read as a probe would: ``outbox health`` (the
exec probe, from the health files) and the HTTP endpoint (``/livez``, ``/readyz``)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from dispatch_support import APP, REPO, DispatchRig
from hypothesis import given
from hypothesis import strategies as st

from benchmarks.chaos.servers import PrivatePostgres, PrivateRedis, free_port
from outbox import ActionRequest
from outbox.dispatch.processes import start_claimer
from outbox.health import HealthFile, ProcessHealth, judge, role_verdict
from tests.apps import dispatch_app

#: Short enough for a test to see a stopped loop go stale within seconds; long enough that a
#: loaded machine's scheduling never makes a running loop look stale. Dramatiq restarts a
#: consumer whose broker is gone every 3 s, each restart a beat: a stale limit above that keeps
#: a worker live through a broker outage.
STALE = "6"
FAST = {
    "OUTBOX_LEASE_SECONDS": "30",
    "OUTBOX_WRITE_MARGIN_SECONDS": "1",
    "OUTBOX_POLL_INTERVAL_SECONDS": "0.5",
    "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "0.5",
    "OUTBOX_PUSH_TIMEOUT_SECONDS": "1",
    "OUTBOX_POOL_SIZE": "4",
    "OUTBOX_HEALTH_STALE_SECONDS": STALE,
}
#: Bounds a failure, not a measurement: a verdict normally changes within seconds.
PATIENCE = 60.0


def probe(directory: Path, role: str | None, *, live: bool = False) -> tuple[int, str]:
    """``outbox health --role ROLE`` as a container healthcheck runs it: exit code and output
    (no role: every role running here, as the image's own HEALTHCHECK asks)."""
    argv = [sys.executable, "-m", "outbox", "health", "--dir", str(directory)]
    argv += (["--role", role] if role else []) + (["--live"] if live else [])
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd=REPO)
    return done.returncode, done.stdout + done.stderr


def http(port: int, path: str) -> int:
    """The status of GET ``path`` on the health endpoint (0: no answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as error:
        return error.code
    except OSError:
        return 0


def eventually(check: Callable[[], bool], what: str, rig: DispatchRig) -> None:
    deadline = time.monotonic() + PATIENCE
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {PATIENCE}s\n{rig.logs()}")
        time.sleep(0.2)


def ready(directory: Path, role: str) -> bool:
    return probe(directory, role)[0] == 0


def live(directory: Path, role: str) -> bool:
    return probe(directory, role, live=True)[0] == 0


def enqueue_one(rig: DispatchRig, key: str) -> int:
    request = ActionRequest(
        kind=rig.rb, workspace_id="w1", lane_key=key, idempotency_key=key, payload={}
    )
    with psycopg.connect(rig.database_url) as conn:
        return rig.outbox().enqueue(conn, request).id


@contextlib.contextmanager
def health_rig(
    database_url: str, schema: str, broker_url: str, directory: Path
) -> Iterator[DispatchRig]:
    settings = {**FAST, "OUTBOX_HEALTH_DIR": str(directory)}
    rig = DispatchRig(database_url, schema, broker_url, settings)
    rig.outbox().migrate()
    with psycopg.connect(database_url, autocommit=True) as conn:
        dispatch_app.create_tables(conn, schema)
    try:
        yield rig
    finally:
        for proc in rig.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)  # a stopped process must see its SIGTERM
        list(rig.stop_all())
        for proc in rig.processes:
            proc.log_path.unlink(missing_ok=True)
        with contextlib.suppress(redis.RedisError):
            client = redis.Redis.from_url(broker_url, socket_timeout=2)
            for name in rig.queues:
                for key in client.scan_iter(match=f"*{name}*"):
                    client.delete(key)


@pytest.fixture
def private_redis() -> Iterator[PrivateRedis]:
    with PrivateRedis() as server:
        yield server


# -- the verdict -------------------------------------------------------------------------------


@given(
    stale=st.integers(1, 120),  # whole seconds: the comparisons at the edge stay exact
    parts=st.lists(
        st.tuples(
            st.floats(0, 300), st.none() | st.floats(0, 300), st.none() | st.text(max_size=5)
        ),
        min_size=1,
        max_size=4,
    ),
)
def test_a_verdict_is_ready_only_when_live_and_every_part_recently_did_its_job(
    stale: int, parts: list[tuple[int, int | None, str | None]]
) -> None:
    now = 1_000_000.0
    snapshot = {
        "stale": stale,
        "parts": {
            f"p{i}": {
                "beat_at": now - quiet,
                "ok_at": None if ok is None else now - ok,
                "problem": p,
            }
            for i, (quiet, ok, p) in enumerate(parts)
        },
    }
    verdict = judge(snapshot, now)
    assert verdict.live == all(quiet <= stale for quiet, _, _ in parts)
    assert verdict.ready == (
        verdict.live and all(ok is not None and ok <= stale and not p for _, ok, p in parts)
    )
    assert verdict.ready or verdict.reasons


def test_a_starting_process_is_live_not_ready_and_a_gone_one_counts_for_nothing(
    tmp_path: Path,
) -> None:
    starting = ProcessHealth("claimer", 5.0, HealthFile(tmp_path, "claimer"))
    starting.publish()
    verdict = role_verdict(tmp_path, "claimer")
    assert verdict.live and not verdict.ready, verdict
    # A crashed process leaves its file behind: a pid that runs no more is skipped.
    gone = subprocess.Popen(["true"])
    gone.wait()
    crashed = HealthFile(tmp_path, "worker", pid=gone.pid)
    crashed.write({**starting.snapshot(), "pid": gone.pid, "role": "worker"})
    code, out = probe(tmp_path, "worker", live=True)
    assert code == 1 and "no running worker process" in out, out
    starting.close()
    assert not list(tmp_path.glob("claimer-*"))


def test_threads_poking_one_process_health_at_once_never_fail_its_file(tmp_path: Path) -> None:
    """A worker's consumer threads and its loop poke the same health, and a readiness change
    writes the file at once: concurrent writes must neither fail (a consumer thread crashed on
    a temporary file another write had moved) nor leave a torn file."""
    import threading

    health = ProcessHealth("worker", 5.0, HealthFile(tmp_path, "worker"))
    errors: list[BaseException] = []

    def poke(part: str) -> None:
        try:
            for i in range(500):
                # Each flip of readiness writes the file.
                if i % 2:
                    health.ok(part)
                else:
                    health.trouble(part, "down")
        except BaseException as error:  # collected: a thread's exception is otherwise lost
            errors.append(error)

    # One part for all: its every flip changes the process's readiness, which writes at once.
    threads = [threading.Thread(target=poke, args=("consumer",)) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors[:3]
    (written,) = tmp_path.glob("worker-*.json")
    assert json.loads(written.read_text())["role"] == "worker"


# -- real processes ----------------------------------------------------------------------------


@pytest.mark.slow
def test_the_broker_gone_makes_claimer_and_workers_unready_but_live_until_it_is_back(
    database_url: str, schema: str, private_redis: PrivateRedis, tmp_path: Path
) -> None:
    port = free_port()
    with health_rig(database_url, schema, private_redis.url, tmp_path) as rig:
        rig.worker(processes=1, threads=4)
        rig.claimer(OUTBOX_HEALTH_PORT=str(port))
        eventually(lambda: ready(tmp_path, "claimer") and ready(tmp_path, "worker"), "ready", rig)
        assert http(port, "/readyz") == 200 and http(port, "/livez") == 200
        rig.wait_ended([enqueue_one(rig, "before")], timeout=30)

        private_redis.stop()
        # The workers' consumers fail at once; the claimer finds out at its next push.
        eventually(lambda: not ready(tmp_path, "worker"), "worker unready", rig)
        waiting = enqueue_one(rig, "during")
        eventually(lambda: http(port, "/readyz") == 503, "claimer unready (HTTP)", rig)
        code, out = probe(tmp_path, "claimer")
        assert code == 1 and "broker" in out, out
        # Both loops still go round: nothing for a liveness probe to restart.
        time.sleep(float(STALE) + 1)
        assert live(tmp_path, "worker"), probe(tmp_path, "worker", live=True)
        assert live(tmp_path, "claimer") and http(port, "/livez") == 200

        private_redis.start()
        eventually(lambda: ready(tmp_path, "claimer") and ready(tmp_path, "worker"), "back", rig)
        assert http(port, "/readyz") == 200
        rig.wait_ended([waiting], timeout=30)


@pytest.mark.slow
def test_postgres_gone_makes_the_claimer_unready_until_it_is_back(
    schema: str, redis_url: str, tmp_path: Path
) -> None:
    with PrivatePostgres() as pg, health_rig(pg.url, schema, redis_url, tmp_path) as rig:
        port = free_port()
        rig.worker(processes=1, threads=4)
        rig.claimer(OUTBOX_HEALTH_PORT=str(port))
        eventually(lambda: ready(tmp_path, "claimer"), "claimer ready", rig)
        assert http(port, "/readyz") == 200

        pg.stop()
        eventually(lambda: not ready(tmp_path, "claimer"), "claimer unready", rig)
        # The file and the endpoint are two probes a moment apart: each must come to say so.
        eventually(lambda: http(port, "/readyz") == 503, "claimer unready (HTTP)", rig)
        body = urllib.request.Request(f"http://127.0.0.1:{port}/readyz")
        with pytest.raises(urllib.error.HTTPError) as answer:
            urllib.request.urlopen(body, timeout=5)
        assert json.loads(answer.value.read())["ready"] is False

        pg.start()
        eventually(lambda: ready(tmp_path, "claimer"), "claimer ready again", rig)
        assert http(port, "/readyz") == 200
        rig.wait_ended([enqueue_one(rig, "after")], timeout=60)


@pytest.mark.slow
def test_a_stopped_worker_process_makes_the_pool_not_live_until_it_runs_again(
    database_url: str, schema: str, redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    with health_rig(database_url, schema, redis_url, tmp_path) as rig:
        rig.worker(processes=2, threads=2, OUTBOX_HEALTH_PORT=str(port))
        eventually(lambda: ready(tmp_path, "worker"), "pool ready", rig)
        eventually(lambda: http(port, "/readyz") == 200, "pool endpoint ready", rig)
        pids = sorted(int(p.stem.split("-")[1]) for p in tmp_path.glob("worker-*.json"))
        assert len(pids) == 2, pids

        os.kill(pids[0], signal.SIGSTOP)
        try:
            eventually(lambda: not live(tmp_path, "worker"), "pool not live", rig)
            code, out = probe(tmp_path, "worker")
            assert code == 1 and f"pid {pids[0]}" in out and f"pid {pids[1]}" not in out, out
            assert http(port, "/livez") == 503 and http(port, "/readyz") == 503
        finally:
            os.kill(pids[0], signal.SIGCONT)
        eventually(lambda: ready(tmp_path, "worker"), "pool ready again", rig)
        assert http(port, "/livez") == 200 and http(port, "/readyz") == 200


def test_a_claimer_stopped_cleanly_leaves_no_health_file(
    database_url: str, schema: str, redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    with health_rig(database_url, schema, redis_url, tmp_path) as rig:
        claimer = start_claimer(APP, rig.env(), cwd=REPO, args=["--health-port", str(port)])
        rig.processes.append(claimer)
        eventually(lambda: ready(tmp_path, "claimer"), "claimer ready", rig)
        assert http(port, "/readyz") == 200 and http(port, "/nothing") == 404
        assert probe(tmp_path, None)[0] == 0, "the image's healthcheck (no role) fails"
        code, out = probe(tmp_path, "worker", live=True)
        assert code == 1 and "no running worker" in out, out
        assert claimer.stop() == 0
        assert not list(tmp_path.glob("claimer-*")), "a stopped claimer left its file"
        code, out = probe(tmp_path, "claimer", live=True)
        assert code == 1 and "no running claimer" in out, out
        assert probe(tmp_path, None, live=True)[0] == 1


@pytest.mark.slow
def test_a_worker_pool_serves_its_health_without_a_health_directory_set(
    database_url: str, schema: str, redis_url: str, tmp_path: Path
) -> None:
    port = free_port()
    with health_rig(database_url, schema, redis_url, tmp_path) as rig:
        # No directory: `outbox worker` makes one for its processes' files.
        rig.worker(processes=1, threads=2, OUTBOX_HEALTH_DIR="", OUTBOX_HEALTH_PORT=str(port))
        eventually(lambda: http(port, "/readyz") == 200, "pool endpoint ready", rig)
        assert http(port, "/livez") == 200
        assert not list(tmp_path.glob("worker-*")), "the files went to the test's directory"
