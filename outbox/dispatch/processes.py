"""Start and stop real claimer and worker processes from a test (yours or the outbox's own).

    with start_worker("myapp.outbox:outbox", env) as worker, start_claimer(app, env):
        ...  # enqueue, then wait for the actions to end

Each process runs in a session of its own, so ``kill()`` (SIGKILL) takes down a ``dramatiq``
(or ``celery worker``) master together with its worker processes, as a crashed machine would.
``start_celery_worker`` runs ``celery -A ... worker`` (the Celery fabric, ``OUTBOX_APP`` naming
the application as for ``outbox worker``).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

#: What ``dramatiq`` logs in each worker process once it consumes.
WORKER_READY = "Worker process is ready for action."
#: What ``celery worker`` logs once it consumes (``celery@host ready.``).
CELERY_WORKER_READY = " ready."
#: The Celery app ``start_celery_worker`` runs unless given another: the outbox's own entry.
CELERY_WORKER_APP = "outbox.dispatch.celery_worker"
#: What the claimer logs once its loop runs.
CLAIMER_READY = "claimer started"


class OutboxProcess:
    """A claimer or worker subprocess whose output goes to a log file."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str], cwd: str | None = None):
        self.argv = list(argv)
        handle, name = tempfile.mkstemp(prefix="outbox-proc-", suffix=".log")
        os.close(handle)
        self.log_path = Path(name)
        with self.log_path.open("wb") as out:
            self.popen = subprocess.Popen(
                self.argv,
                env={**os.environ, **env},
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, timeout: float = 30.0, count: int = 1) -> None:
        """Until ``text`` appears ``count`` times in the output; raises if the process died."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.output().count(text) >= count:
                return
            if self.popen.poll() is not None:
                raise RuntimeError(f"{self.argv} exited {self.popen.returncode}:\n{self.output()}")
            time.sleep(0.05)
        raise TimeoutError(f"{text!r} not seen in {timeout}s from {self.argv}:\n{self.output()}")

    def kill(self) -> None:
        """SIGKILL to the whole session: no clean-up of any kind runs."""
        self._signal_group(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM (a clean stop); SIGKILL after ``timeout``. Returns the exit code."""
        if self.popen.poll() is None:
            # To the master only: dramatiq relays it to its workers (a second one kills them).
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.popen.wait(10)
        # Worker processes of a dramatiq master may outlive it by a moment.
        self._signal_group(signal.SIGKILL)
        return self.popen.returncode

    def _signal_group(self, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, sig)

    def close(self) -> None:
        self.stop()
        self.log_path.unlink(missing_ok=True)

    def __enter__(self) -> OutboxProcess:
        return self

    def __exit__(self, *_exc_info: object) -> None:
        self.close()


def start_claimer(
    app: str,
    env: Mapping[str, str],
    *,
    args: Sequence[str] = (),
    cwd: str | None = None,
    wait: bool = True,
) -> OutboxProcess:
    """``outbox claimer APP`` with ``env`` (OUTBOX_* settings) added to this environment."""
    proc = OutboxProcess([sys.executable, "-m", "outbox", "claimer", app, *args], env, cwd)
    if wait:
        proc.wait_for(CLAIMER_READY)
    return proc


def start_worker(
    app: str,
    env: Mapping[str, str],
    *,
    processes: int = 1,
    threads: int = 4,
    queues: Sequence[str] = (),
    cwd: str | None = None,
    wait: bool = True,
) -> OutboxProcess:
    """``outbox worker APP -p N -t N`` (which execs ``dramatiq outbox.dispatch.worker``)."""
    argv = [sys.executable, "-m", "outbox", "worker", app]
    argv += ["--processes", str(processes), "--threads", str(threads)]
    if queues:
        argv += ["--queues", *queues]
    proc = OutboxProcess(argv, env, cwd)
    if wait:
        proc.wait_for(WORKER_READY, timeout=60.0, count=processes)
    return proc


def start_celery_worker(
    env: Mapping[str, str],
    *,
    celery_app: str = CELERY_WORKER_APP,
    queues: Sequence[str],
    pool: str = "threads",
    concurrency: int = 4,
    cwd: str | None = None,
    wait: bool = True,
) -> OutboxProcess:
    """``celery -A CELERY_APP worker -Q QUEUES`` with ``env`` added to this environment: the
    outbox's own entry (``OUTBOX_APP`` in ``env`` names the application) unless ``celery_app``
    names a shop's app that installed the outbox. Each worker gets a node name of its own."""
    argv = [sys.executable, "-m", "celery", "-A", celery_app, "worker"]
    argv += ["--queues", ",".join(queues), "--pool", pool, "--concurrency", str(concurrency)]
    argv += ["--hostname", f"outbox-{uuid.uuid4().hex[:8]}@%h", "--loglevel", "INFO"]
    argv += ["--without-gossip", "--without-mingle", "--without-heartbeat"]
    proc = OutboxProcess(argv, env, cwd)
    if wait:
        proc.wait_for(CELERY_WORKER_READY, timeout=60.0)
    return proc
