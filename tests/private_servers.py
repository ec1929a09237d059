"""Private PostgreSQL and Redis servers that a test may stop, restart, pause and resume.

The shared services are never touched: each instance lives in a temporary directory on a free
port of its own and is removed on ``close()`` (or leaving the ``with`` block).

    with PrivatePostgres() as pg, PrivateRedis() as broker:
        env = {"OUTBOX_DATABASE_URL": pg.url, "OUTBOX_BROKER_URL": broker.url}
        broker.pause()     # SIGSTOP: connections stay open, nothing answers
        broker.resume()
        pg.stop(); pg.start()

PostgreSQL refuses to run as root, so when the tests run as root its commands run as the
``postgres`` user (``runuser``).
"""

from __future__ import annotations

import contextlib
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
from typing import Self

PG_BIN = Path(os.environ.get("OUTBOX_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
REDIS_SERVER = os.environ.get("OUTBOX_TEST_REDIS_SERVER", "redis-server")


def free_port() -> int:
    """A TCP port nobody listens on right now (the kernel's pick)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_listening(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port} after {timeout}s")


def _signal_tree(root: int, sig: signal.Signals) -> None:
    """``sig`` to ``root`` and every process below it (a postmaster and its backends)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            stat = (entry / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    pending = [root]
    while pending:
        pid = pending.pop()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
        pending.extend(children.get(pid, []))


class PrivateServer:
    """What both servers offer: start, stop, restart, pause, resume, ``url``; a context manager."""

    port: int

    @property
    def url(self) -> str:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError

    def pid(self) -> int:
        raise NotImplementedError

    def restart(self) -> None:
        self.stop()
        self.start()

    def pause(self) -> None:
        """SIGSTOP to the server and its children: sockets stay open, nothing answers."""
        _signal_tree(self.pid(), signal.SIGSTOP)

    def resume(self) -> None:
        _signal_tree(self.pid(), signal.SIGCONT)

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
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
    """A PostgreSQL cluster of its own (initdb on first start; trust auth, user ``postgres``)."""

    def __init__(self, database: str = "test") -> None:
        self.port = free_port()
        self.database = database
        self.root = Path(tempfile.mkdtemp(prefix="outbox-pg-"))
        self.data = self.root / "data"
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            account = pwd.getpwnam("postgres")
            os.chown(self.root, account.pw_uid, account.pw_gid)
        self._initialised = False

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{self.database}"

    def _run(self, *argv: str, timeout: float = 60.0) -> None:
        command = list(argv)
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    def start(self) -> None:
        if not self._initialised:
            self._run(
                str(PG_BIN / "initdb"), "-D", str(self.data), "-U", "postgres",
                "--auth=trust", "--no-sync", "-E", "UTF8",
            )  # fmt: skip
            self._initialised = True
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off "
            "-c max_connections=50"
        )
        self._run(
            str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.root / "server.log"),
            "-o", options, "-w", "-t", "30", "start",
        )  # fmt: skip
        _wait_listening(self.port, 30)
        if self.database != "postgres":
            import psycopg

            admin = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
            with psycopg.connect(admin, autocommit=True) as conn:
                found = conn.execute(
                    "SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)
                ).fetchone()
                if not found:
                    conn.execute(f'CREATE DATABASE "{self.database}"')

    def stop(self, mode: str = "fast") -> None:
        """``pg_ctl stop -m fast`` (or ``immediate``: a crash); a paused server is resumed first."""
        if not (self.data / "postmaster.pid").exists():
            return
        with contextlib.suppress(Exception):
            self.resume()
        self._run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def pid(self) -> int:
        return int((self.data / "postmaster.pid").read_text().split()[0])

    def log(self) -> str:
        path = self.root / "server.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


class PrivateRedis(PrivateServer):
    """A ``redis-server`` of its own, without persistence; ``stop`` loses what it held."""

    def __init__(self) -> None:
        self.port = free_port()
        self.root = Path(tempfile.mkdtemp(prefix="outbox-redis-"))
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            return
        with (self.root / "server.log").open("ab") as out:
            self.popen = subprocess.Popen(
                [
                    REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1",
                    "--save", "", "--appendonly", "no", "--dir", str(self.root),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
            )  # fmt: skip
        _wait_listening(self.port, 10)

    def stop(self) -> None:
        if self.popen is None or self.popen.poll() is not None:
            return
        with contextlib.suppress(Exception):
            self.resume()
        self.popen.terminate()
        try:
            self.popen.wait(10)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.popen.wait(10)

    def pid(self) -> int:
        assert self.popen is not None, "not started"
        return self.popen.pid

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)
