"""The claimer and worker processes of the soak: started, SIGKILLed at random, replaced.

Each process is a session of its own (``outbox.dispatch.processes``), so a SIGKILL takes a
``dramatiq`` (or ``celery worker``) master down with its worker processes at once, as a crashed
machine would. On the Celery fabric (``OUTBOX_FABRIC=celery`` in the environment) each worker is
a ``celery worker`` of ``WORKER_THREADS`` threads. Every
end of a process (kill, or the clean stop at the end) is committed to ``<watch>.process_end``
with the database clock just before and just after the signal, keyed by the process group id
that the adapters record with each attempt. A worker-pool outage SIGKILLs every worker and
starts them again only when it ends.
"""

from __future__ import annotations

import random
import signal
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from benchmarks.chaos.app import QUEUES
from outbox.dispatch.processes import (
    OutboxProcess,
    start_celery_worker,
    start_claimer,
    start_worker,
)

#: The soak's application, as the processes load it.
APP = "benchmarks.chaos.app:make_outbox"
#: Threads of each worker process (one attempt at a time per thread).
WORKER_THREADS = 8
#: How many more kills one role may have had than the other before the other is picked.
MAX_KILL_LEAD = 3


@dataclass
class Member:
    role: str  # "claimer" or "worker"
    proc: OutboxProcess


class Fleet:
    """``claimers`` claimer processes and ``workers`` one-process dramatiq (or Celery) worker
    pools."""

    def __init__(
        self,
        env: Mapping[str, str],
        cwd: str,
        conn: psycopg.Connection[Any],
        watch: str,
        claimers: int = 2,
        workers: int = 2,
    ) -> None:
        self.env = dict(env)
        self.cwd = cwd
        self.conn = conn
        self.table = f'"{watch}".process_end'
        self.attempts = f'"{watch}".attempt'
        self.shape = {"claimer": claimers, "worker": workers}
        self.members: list[Member] = []
        self.kills: dict[str, int] = {"claimer": 0, "worker": 0}

    def _spawn(self, role: str, wait: bool) -> Member:
        if role == "claimer":
            proc = start_claimer(APP, self.env, cwd=self.cwd, wait=wait)
        elif self.env.get("OUTBOX_FABRIC") == "celery":
            proc = start_celery_worker(
                {**self.env, "OUTBOX_APP": APP},
                queues=QUEUES,
                concurrency=WORKER_THREADS,
                cwd=self.cwd,
                wait=wait,
            )
        else:
            proc = start_worker(
                APP, self.env, processes=1, threads=WORKER_THREADS, cwd=self.cwd, wait=wait
            )
        member = Member(role, proc)
        self.members.append(member)
        return member

    def start(self) -> None:
        """Starts the whole fleet and waits until every process is ready."""
        for role, count in self.shape.items():
            for _ in range(count):
                self._spawn(role, wait=True)

    def _now(self) -> Any:
        row = self.conn.execute("SELECT clock_timestamp()").fetchone()
        assert row is not None
        return row[0]

    def _record(self, member: Member, how: str, before: Any) -> None:
        self.conn.execute(
            f"INSERT INTO {self.table} (pgid, role, how, before, after)"
            " VALUES (%s, %s, %s, %s, %s)",
            (member.proc.pid, member.role, how, before, self._now()),
        )

    def pick(self, rng: random.Random) -> Member:
        """A random member, the next victim; of the other role once one role has had
        MAX_KILL_LEAD more kills, so that a short run kills both roles."""
        ahead = max(self.kills, key=lambda role: self.kills[role])
        others = [m for m in self.members if m.role != ahead]
        if self.kills[ahead] - min(self.kills.values()) >= MAX_KILL_LEAD and others:
            return rng.choice(others)
        return rng.choice(self.members)

    def writing(self, kind: str, for_at_least: float) -> list[Member]:
        """Live workers that hold an attempt of ``kind`` whose fence passed and that has not
        stopped, ``for_at_least`` seconds after it asked its fence: a SIGKILL of one of them
        now lands between the fence and the finish. (An attempt still writing that long after
        its fence is a slow one, a pause or a late reply, so it is still writing at the kill.)"""
        workers = {m.proc.pid: m for m in self.members if m.role == "worker"}
        rows = self.conn.execute(
            f"SELECT DISTINCT pgid FROM {self.attempts}"
            " WHERE kind = %s AND fence_passed AND stopped_at IS NULL AND pgid = ANY(%s)"
            " AND fence_asked_at < clock_timestamp() - make_interval(secs => %s)"
            " ORDER BY pgid",
            (kind, list(workers), for_at_least),
        ).fetchall()
        return [workers[pgid] for (pgid,) in rows]

    def kill(self, victim: Member) -> Member:
        """SIGKILLs ``victim``, records it, and starts its replacement (not waiting)."""
        before = self._now()
        victim.proc.kill()
        self._record(victim, "SIGKILL", before)
        self.members.remove(victim)
        victim.proc.log_path.unlink(missing_ok=True)
        self.kills[victim.role] += 1
        self._spawn(victim.role, wait=False)
        return victim

    def pool_down(self) -> int:
        """A worker-pool outage: SIGKILLs every worker, each recorded, none replaced (random
        kills meanwhile fall on claimers); returns how many went down."""
        workers = [m for m in self.members if m.role == "worker"]
        before = self._now()
        for member in workers:
            member.proc.kill()
        for member in workers:
            self._record(member, "SIGKILL", before)
            self.members.remove(member)
            member.proc.log_path.unlink(missing_ok=True)
        return len(workers)

    def pool_up(self) -> None:
        """Ends the outage: starts the pool's workers again (not waiting)."""
        missing = self.shape["worker"] - sum(m.role == "worker" for m in self.members)
        for _ in range(missing):
            self._spawn("worker", wait=False)

    def stop(self) -> None:
        """A clean stop of every member (running attempts finish first), each end recorded."""
        before = self._now()
        for member in self.members:
            if member.proc.popen.poll() is None:
                member.proc.popen.send_signal(signal.SIGTERM)
        for member in self.members:
            member.proc.stop()
            self._record(member, "SIGTERM", before)
            member.proc.log_path.unlink(missing_ok=True)
        self.members.clear()

    def logs(self) -> str:
        return "\n".join(
            f"--- {m.role} {m.proc.pid}\n{m.proc.output()[-3000:]}" for m in self.members
        )
