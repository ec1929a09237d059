"""A missing service skips the tests that need it, naming the service and its URL; in CI
(``CI=true``) it fails them instead. Each case runs pytest in a subprocess against closed ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

PROBES = """
def test_needs_postgresql(database_url):
    pass

def test_needs_a_schema(schema):
    pass

def test_needs_redis(redis_url):
    pass

def test_needs_rabbitmq(rabbitmq_url):
    pass

def test_needs_nothing():
    pass
"""


def closed_port() -> int:
    """A local port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run_probes(tmp_path: Path, ci: str | None) -> subprocess.CompletedProcess[str]:
    (tmp_path / "conftest.py").write_text("from tests.conftest import *  # noqa: F403\n")
    (tmp_path / "test_probes.py").write_text(PROBES)
    port = closed_port()
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env.update(
        PYTHONPATH=str(REPO),
        OUTBOX_TEST_DATABASE_URL=f"postgresql://postgres:hunter2@127.0.0.1:{port}/test",
        OUTBOX_TEST_REDIS_URL=f"redis://127.0.0.1:{port}/15",
        OUTBOX_TEST_RABBITMQ_URL=f"amqp://guest:guest@127.0.0.1:{port}/%2F",
    )
    if ci is not None:
        env["CI"] = ci
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-rs", "-p", "no:cacheprovider", "test_probes.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_missing_service_skips_with_its_name_and_url(tmp_path):
    done = run_probes(tmp_path, ci=None)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed, 4 skipped" in done.stdout, done.stdout
    assert "PostgreSQL not reachable at postgresql://postgres:***@127.0.0.1:" in done.stdout
    assert "Redis not reachable at redis://127.0.0.1:" in done.stdout
    assert "RabbitMQ not reachable at amqp://guest:***@127.0.0.1:" in done.stdout
    assert "hunter2" not in done.stdout
    assert "error" not in done.stdout.lower()


@pytest.mark.parametrize("ci", ["true", "TRUE"])
def test_in_ci_a_missing_service_fails_the_run(tmp_path, ci):
    done = run_probes(tmp_path, ci=ci)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 passed, 4 errors" in done.stdout, done.stdout
    assert "CI=true: a missing service fails the run" in done.stdout
    assert "skipped" not in done.stdout
