"""Private PostgreSQL and Redis servers for faults: each on its own free port and temp dir, so a
test or the soak may stop, restart or pause them without touching any shared server; and a hot
standby of a private PostgreSQL (``PrivateStandby``) for what replication holds on its primary.

    with PrivatePostgres() as pg, PrivateRedis() as broker:
        ...  # pg.url, broker.url; pg.restart(downtime=2.0); broker.pause() ... broker.resume()

Each server runs as a child process in a session of its own (so ``pause`` stops the postmaster
and every backend at once), dies with the process that started it (``PR_SET_PDEATHSIG``), and
is stopped and its files removed on ``close()``, on leaving the ``with`` block, and at exit.
PostgreSQL runs with fsync off and small buffers: it starts in about a second. As root it runs
as the ``postgres`` user (``initdb`` refuses root).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

PG_BIN = Path(os.environ.get("OUTBOX_PG_BIN", "/usr/lib/postgresql/15/bin"))
REDIS_SERVER = os.environ.get("OUTBOX_REDIS_SERVER", "redis-server")
#: How long a server may take to accept connections after it was started.
START_TIMEOUT = 30.0
_PR_SET_PDEATHSIG = 1


def missing_binaries() -> str | None:
    """What is missing to start the private servers here, or None."""
    if not (PG_BIN / "initdb").exists():
        return f"PostgreSQL server binaries not found in {PG_BIN} (set OUTBOX_PG_BIN)"
    if shutil.which(REDIS_SERVER) is None:
        return f"{REDIS_SERVER} not found (set OUTBOX_REDIS_SERVER)"
    return None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child, before exec (after any uid change, which would clear it)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def _accepts(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), 0.5):
            return True
    except OSError:
        return False


class PrivateServer:
    """A server process on ``port``, started by ``start()``; subclasses give its command line."""

    name = "server"

    def __init__(self) -> None:
        self.port = free_port()
        self.dir = Path(tempfile.mkdtemp(prefix=f"outbox-{self.name}-"))
        self.log_path = self.dir / "server.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.user: str | None = None
        atexit.register(self.close)

    def argv(self) -> list[str]:
        raise NotImplementedError

    @property
    def url(self) -> str:
        raise NotImplementedError

    def _ready(self) -> bool:
        return _accepts(self.port)

    def start(self) -> None:
        """Starts the server and waits until it accepts connections."""
        if self.running:
            return
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv(),
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                preexec_fn=_die_with_parent,
                user=self.user,
                cwd=self.dir,
            )
        deadline = time.monotonic() + START_TIMEOUT
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{self.name} on port {self.port} did not start:\n{self.log()}")
            time.sleep(0.05)

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, sig: signal.Signals = signal.SIGTERM, timeout: float = 20.0) -> None:
        """Stops the server (resuming it first if paused); SIGKILL after ``timeout``."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self._signal(signal.SIGCONT)
            proc.send_signal(sig)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait(10)
        self._signal(signal.SIGKILL)  # any child that outlived it
        self.proc = None

    def restart(self, downtime: float = 0.0) -> None:
        """Stops the server, stays down ``downtime`` seconds, starts it on the same port."""
        self.stop()
        time.sleep(downtime)
        self.start()

    def pause(self) -> None:
        """SIGSTOP to the server and all its processes: connections stay open, nothing answers."""
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def close(self) -> None:
        """Stops the server and removes its files; safe to call more than once."""
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)
        atexit.unregister(self.close)

    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class PrivatePostgres(PrivateServer):
    """PostgreSQL 15 in a temp dir: trust auth, user ``postgres``, database ``postgres``."""

    name = "postgres"

    def __init__(self, max_connections: int = 200, settings: dict[str, str] | None = None) -> None:
        super().__init__()
        self.max_connections = max_connections
        #: More server settings (``shared_preload_libraries`` for a test that reads
        #: ``pg_stat_statements``), over the defaults below.
        self.settings = dict(settings or {})
        self.data = self.dir / "data"
        if os.geteuid() == 0:
            self.user = "postgres"
            entry = pwd.getpwnam("postgres")
            os.chown(self.dir, entry.pw_uid, entry.pw_gid)
        self._initdb()

    def _initdb(self) -> None:
        self._run_tool(
            "initdb",
            "-D",
            str(self.data),
            "-U",
            "postgres",
            "-A",
            "trust",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale",
            "C",
        )

    def _run_tool(self, tool: str, *args: str) -> None:
        """Runs one of PostgreSQL's programs as the server's user, in the server's directory."""
        result = subprocess.run(
            [str(PG_BIN / tool), *args], capture_output=True, user=self.user, cwd=self.dir
        )
        if result.returncode != 0:
            raise RuntimeError(f"{tool} failed: {result.stderr.decode(errors='replace')}")

    def argv(self) -> list[str]:
        settings = {
            "port": self.port,
            "listen_addresses": "127.0.0.1",
            "unix_socket_directories": str(self.dir),
            "fsync": "off",
            "synchronous_commit": "off",
            "full_page_writes": "off",
            "shared_buffers": "32MB",
            "max_connections": self.max_connections,
            **self.settings,
        }
        flags = [arg for key, value in settings.items() for arg in ("-c", f"{key}={value}")]
        return [str(PG_BIN / "postgres"), "-D", str(self.data), *flags]

    def _ready(self) -> bool:
        if not _accepts(self.port):
            return False
        # The port opens before recovery ends: ready once a query answers.
        import psycopg

        try:
            with psycopg.connect(self.url, connect_timeout=2) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def stop(self, sig: signal.Signals = signal.SIGINT, timeout: float = 20.0) -> None:
        """Fast shutdown by default (SIGINT: open sessions are ended, as in a restart)."""
        super().stop(sig, timeout)

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"


class PrivateStandby(PrivatePostgres):
    """A hot standby of ``primary`` (a running ``PrivatePostgres``), streaming from it: copied
    with ``pg_basebackup``, through a physical replication slot named ``slot`` (created on the
    primary by the copy) or without one (``slot`` None). ``hot_standby_feedback`` is on, and
    reported every second, so that the primary holds its vacuum horizon for the standby's
    oldest snapshot."""

    name = "standby"

    def __init__(self, primary: PrivatePostgres, slot: str | None = None) -> None:
        self.primary = primary
        self.slot = slot
        super().__init__(
            settings={"hot_standby_feedback": "on", "wal_receiver_status_interval": "1s"}
        )

    def _initdb(self) -> None:
        slot = ["--create-slot", "--slot", self.slot] if self.slot else []
        self._run_tool(
            "pg_basebackup",
            "--pgdata",
            str(self.data),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.primary.port),
            "--username",
            "postgres",
            "--write-recovery-conf",
            "--checkpoint",
            "fast",
            "--no-sync",
            *slot,
        )


class PrivateRedis(PrivateServer):
    """Redis without persistence: a restart loses every queued message."""

    name = "redis"

    def argv(self) -> list[str]:
        return [
            REDIS_SERVER,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
        ]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"
