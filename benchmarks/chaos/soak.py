"""One soak run: set up, start the providers (the SMTP sink, the HTTP receivers) and the fleet,
enqueue while killing and injecting faults, settle, check.

By default the run starts its own PostgreSQL and Redis (``servers``), so that it may restart
them; with ``private_servers=False`` it runs on ``database_url`` and ``broker_url`` and the only
fault besides the kills is the worker-pool outage. The run owns three schemas
(``chaos_<pid>_<seed>`` and its ``_world``/``_watch``), dropped at the end unless ``keep``, and
one Redis database (flushed before and after: the EMAIL kind's queue name is shared, so the soak
must not share a Redis database with anything else).
"""

from __future__ import annotations

import os
import random
import socket
import subprocess
import sys
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import psycopg
import redis

from benchmarks.chaos import checks, faults, receivers, report, sink, tables, workload
from benchmarks.chaos.app import SENDER
from benchmarks.chaos.fleet import Fleet, Member
from benchmarks.chaos.servers import PrivatePostgres, PrivateRedis
from benchmarks.chaos.tables import Schemas
from outbox import EMAIL, Outbox, erase_subject
from outbox.webhook import add_subscription, new_secret

REPO = str(Path(__file__).resolve().parents[2])
#: The soak's own Redis database (the tests use 15, the benchmarks 14).
DEFAULT_BROKER_URL = "redis://127.0.0.1:6379/11"
DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"
#: Enqueue batches are this far apart; the actions are spread over ENQUEUE_SHARE of the run.
BATCH_EVERY = 0.2
ENQUEUE_SHARE = 0.75
#: The HTTP kinds' timeout per request: well inside the write margin, and shorter than the
#: receivers' slow answer, so a ``t`` fault is a timeout after the write.
HTTP_TIMEOUT = 1.0
#: Every other worker kill, the first included, is aimed (every one until an aimed kill hit): it
#: waits up to AIM_PATIENCE s for a worker that is sending an email past its fence (for
#: AIM_AFTER_FENCE s already) and kills that one. Kills at random moments alone can all miss the
#: at-most-once fence-to-finish window, and then the UNCERTAIN check has nothing to examine.
AIM_PATIENCE = 3.0
AIM_AFTER_FENCE = 0.05
#: If no aimed kill hit by the end of the kills (a fault or the outage can take the moments
#: when emails sat past their fence), aimed kills go on this long into the settle, which still
#: drains emails: each kills only a worker found sending an email past its fence.
AIM_GRACE = 30.0


@dataclass(frozen=True)
class Options:
    actions: int = 2500
    duration: float = 45.0
    kill_interval: float = 3.0
    seed: int = 1
    erasures: int = 4
    #: Short leases so that killed work is reclaimed within seconds; the margin bounds every
    #: provider call (the lingers and the sink's late 250 stay well inside it).
    lease: float = 6.0
    write_margin: float = 2.0
    #: How long the settle phase may wait for every action to end after the kills stop (it
    #: ends as soon as they have). A bound for an overloaded machine, where the SMTP sink's
    #: injected 4xx answers and their backoff still kept a few emails waiting at 120 s.
    settle: float = 300.0
    database_url: str = DEFAULT_DATABASE_URL
    broker_url: str = DEFAULT_BROKER_URL
    keep: bool = False
    #: Run on a PostgreSQL and a Redis of the soak's own (then ``database_url`` and
    #: ``broker_url`` are not used), so that it may restart them.
    private_servers: bool = True
    #: Inject the scheduled faults (``faults``) besides the random SIGKILLs.
    faults: bool = True
    #: The dispatch fabric the fleet runs on: ``dramatiq`` or ``celery`` (Celery on Redis).
    fabric: str = "dramatiq"


@dataclass
class Outcome:
    checks: list[checks.Check]
    #: What happened (kills, retries, erasures...), as in the table.
    happened: dict[str, Any]
    table: str

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def _env(o: Options, s: Schemas, smtp_port: int, http_port: int) -> dict[str, str]:
    http = f"http://127.0.0.1:{http_port}"
    return {
        "OUTBOX_DATABASE_URL": o.database_url,
        "OUTBOX_SCHEMA": s.outbox,
        "OUTBOX_BROKER_URL": o.broker_url,
        "OUTBOX_FABRIC": o.fabric,
        "OUTBOX_SMTP_URL": f"smtp://127.0.0.1:{smtp_port}?timeout=5",
        "OUTBOX_SMTP_SENDER": SENDER,
        "OUTBOX_LEASE_SECONDS": str(o.lease),
        "OUTBOX_WRITE_MARGIN_SECONDS": str(o.write_margin),
        "OUTBOX_POLL_INTERVAL_SECONDS": "0.2",
        "OUTBOX_HOUSEKEEPING_INTERVAL_SECONDS": "1",
        "OUTBOX_RETRY_BASE_SECONDS": "0.3",
        "OUTBOX_RETRY_CAP_SECONDS": "2",
        "OUTBOX_IN_FLIGHT": "24",
        "OUTBOX_POOL_SIZE": "4",
        # The webhook subscriptions point at the receiver on loopback.
        "OUTBOX_WEBHOOK_ALLOW_PRIVATE": "127.0.0.1/32",
        "OUTBOX_WEBHOOK_TIMEOUT_SECONDS": str(HTTP_TIMEOUT),
        # Faults and restarts make an endpoint fail several times in a row; a disabled one would
        # wait 5 minutes, past the settle phase.
        "OUTBOX_WEBHOOK_DISABLE_AFTER_FAILURES": "1000",
        "OUTBOX_GITHUB_TOKEN": receivers.TOKEN,
        "OUTBOX_GITHUB_API_URL": f"{http}/github",
        "OUTBOX_GITHUB_TIMEOUT_SECONDS": str(HTTP_TIMEOUT),
        "OUTBOX_SLACK_TOKEN": receivers.TOKEN,
        "OUTBOX_SLACK_API_URL": f"{http}/slack/api",
        "OUTBOX_SLACK_TIMEOUT_SECONDS": str(HTTP_TIMEOUT),
        "CHAOS_WATCH_SCHEMA": s.watch,
        "PYTHONPATH": REPO,
    }


class Soak:
    def __init__(self, o: Options) -> None:
        self.o = o
        self.s = Schemas(f"chaos_{os.getpid()}_{o.seed}")
        self.rng = random.Random(o.seed)
        self.pg: PrivatePostgres | None = None
        self.redis: PrivateRedis | None = None
        self.fleet: Fleet | None = None
        self.expected_erased: dict[str, set[int]] = {}
        self.by_account: dict[str, set[int]] = {}
        #: The receiver's slot of each webhook subscription id.
        self.slots: dict[int, str] = {}
        #: Aimed worker kills that found an email past its fence.
        self.aimed_hits = 0

    def log(self, text: str) -> None:
        print(f"[chaos {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    def run(self) -> Outcome:
        with ExitStack() as servers:
            if self.o.private_servers:
                self.pg = servers.enter_context(PrivatePostgres())
                self.redis = servers.enter_context(PrivateRedis())
                self.o = replace(self.o, database_url=self.pg.url, broker_url=self.redis.url)
                self.log(f"private servers: {self.pg.url}, {self.redis.url}")
            return self._run()

    def connect(self) -> psycopg.Connection[Any]:
        """(Re)opens the harness's connections: ``watch`` (autocommit) and ``writer`` (the
        application's transactions); returns ``watch``."""
        for old in (getattr(self, "watch", None), getattr(self, "writer", None)):
            if old is not None:
                with suppress(psycopg.Error):
                    old.close()
        self.watch = psycopg.connect(self.o.database_url, autocommit=True)
        self.writer = psycopg.connect(self.o.database_url)
        if self.fleet is not None:
            self.fleet.conn = self.watch
        return self.watch

    def _run(self) -> Outcome:
        o, s = self.o, self.s
        started = time.monotonic()
        self.outbox = Outbox(o.database_url, schema=s.outbox)
        self.outbox.declare(EMAIL)
        watch = self.connect()
        broker = redis.Redis.from_url(o.broker_url)
        sink_proc: subprocess.Popen[bytes] | None = None
        http_proc: subprocess.Popen[bytes] | None = None
        fleet: Fleet | None = None
        try:
            tables.drop(watch, s)
            self.outbox.migrate(watch)
            tables.create(watch, s)
            broker.flushdb()
            mix = workload.plan(o.actions, o.seed)
            http_port = _free_port()
            self._subscribe(watch, http_port)
            sink_proc = self._start("benchmarks.chaos.sink", sink.READY, _free_port())
            http_proc = self._start("benchmarks.chaos.receivers", receivers.READY, http_port)
            env = _env(o, s, int(sink_proc.args[-1]), http_port)
            fleet = self.fleet = Fleet(env, REPO, watch, s.watch)
            fleet.start()
            self.log(
                f"fleet up; {o.actions} actions over {o.duration:.0f}s, a kill every "
                f"~{o.kill_interval}s, schema {s.outbox}"
            )
            plan = faults.schedule(o.duration, o.lease, self.pg is not None) if o.faults else []
            injector = faults.Injector(
                plan, fleet, s.watch, self.pg, self.redis, self.connect, self.log
            )
            self._chaos(fleet, injector, mix)
            watch = self.watch
            self._settle(fleet, watch)
            fleet.stop()
            evidence = checks.Evidence.load(watch, s, self.expected_erased)
            results, caused = checks.run_all(evidence)
            rows = report.happenings(evidence, caused, self.aimed_hits)
            table = report.render(results, rows, time.monotonic() - started)
            return Outcome(results, dict(rows), table)
        finally:
            if fleet is not None:
                fleet.stop()
            for proc in (sink_proc, http_proc):
                if proc is not None:
                    proc.kill()
                    proc.wait(10)
            broker.flushdb()
            if not o.keep:
                tables.drop(self.watch, s)
            self.writer.close()
            self.watch.close()

    def _subscribe(self, conn: psycopg.Connection[Any], port: int) -> None:
        """WEBHOOK_SLOTS subscriptions to the receiver, slot i to event type i % EVENT_TYPES,
        each with its own secret (the receiver verifies with it)."""
        for slot in range(workload.WEBHOOK_SLOTS):
            secret = new_secret()
            subscription = add_subscription(
                conn,
                f"http://127.0.0.1:{port}/hooks/{slot}",
                [secret],
                [workload.event_type(slot)],
                schema=self.s.outbox,
            )
            conn.execute(
                f'INSERT INTO "{self.s.world}".webhook_endpoint (slot, subscription, secret)'
                " VALUES (%s, %s, %s)",
                (str(slot), subscription.id, secret),
            )
            self.slots[subscription.id] = str(slot)

    def _start(self, module: str, ready: str, port: int) -> subprocess.Popen[bytes]:
        """Starts a provider process (the SMTP sink, the HTTP receivers) and waits until it
        listens on ``port`` (its last argument)."""
        proc = subprocess.Popen(
            [sys.executable, "-m", module, self.o.database_url, self.s.world, str(port)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        if ready not in line:
            proc.kill()
            raise RuntimeError(f"{module} did not start: {line!r}")
        return proc

    def _chaos(self, fleet: Fleet, injector: faults.Injector, mix: list[workload.Planned]) -> None:
        """Enqueues the mix in batches, erases a few accounts, kills a process every
        ``kill_interval`` (jittered) and injects the scheduled faults, until ``duration`` has
        passed. No random kill is aimed or made while a fault is in progress."""
        o, rng = self.o, self.rng
        t0 = time.monotonic()
        span = o.duration * ENQUEUE_SHARE
        batches = max(1, int(span / BATCH_EVERY))
        per_batch = -(-len(mix) // batches)
        erase_at = sorted(rng.uniform(0.2, 0.9) * span for _ in range(o.erasures))
        next_kill = t0 + o.kill_interval * rng.uniform(0.5, 1.5)
        victim: Member | None = None
        aimed, give_up = False, 0.0
        cursor = 0
        while True:
            now = time.monotonic()
            late = now - t0 >= o.duration
            if late and cursor >= len(mix) and not injector.busy:
                if self.aimed_hits or now - t0 >= o.duration + AIM_GRACE or not o.kill_interval:
                    break
                # Late: only an aimed kill, and only at a worker sending an email past its fence.
                writing = fleet.writing(EMAIL.name, AIM_AFTER_FENCE)
                if writing:
                    killed = fleet.kill(rng.choice(writing))
                    self.aimed_hits += 1
                    self.log(f"SIGKILL {killed.role} {killed.proc.pid} (aimed, late)")
                time.sleep(0.1)
                continue
            due = min(len(mix), per_batch * (int((now - t0) / BATCH_EVERY) + 1))
            if cursor < due:
                self._enqueue(self.writer, self.watch, mix[cursor:due])
                cursor = due
            if erase_at and now - t0 >= erase_at[0]:
                erase_at.pop(0)
                self._erase(self.writer, self.watch)
            if victim is None:
                injector.tick(now - t0, self.watch)
            if victim is None and not injector.busy and now >= next_kill and now - t0 < o.duration:
                victim = fleet.pick(rng)
                # Aimed until one hits: a fault just before can leave no email past its fence.
                aimed = victim.role == "worker" and (
                    fleet.kills["worker"] % 2 == 0 or self.aimed_hits == 0
                )
                give_up = now + (AIM_PATIENCE if aimed else 0.0)
            if victim is not None:
                writing = fleet.writing(EMAIL.name, AIM_AFTER_FENCE) if aimed else []
                if writing or now >= give_up:
                    killed = fleet.kill(rng.choice(writing) if writing else victim)
                    self.aimed_hits += bool(writing)
                    how = " (aimed: an email past its fence)" if writing else ""
                    self.log(f"SIGKILL {killed.role} {killed.proc.pid}{how}")
                    victim = None
                    # From when it was due: an aimed kill's wait does not slow the cadence.
                    next_kill += o.kill_interval * rng.uniform(0.5, 1.5)
            time.sleep(0.02)

    def _enqueue(
        self, writer: psycopg.Connection[Any], watch: psycopg.Connection[Any], batch: list[Any]
    ) -> None:
        for e in workload.enqueue_batch(writer, self.outbox, self.s.watch, batch, self.slots):
            if e.item.account is not None:
                self.by_account.setdefault(e.item.account, set()).add(e.action_id)

    def _erase(self, writer: psycopg.Connection[Any], watch: psycopg.Connection[Any]) -> None:
        """Erases one account that has actions and was not erased yet, preferring one with a
        write in flight (the case where the erased action's lane must stay held until its lease
        ends); records which actions it had to delete (all of its actions enqueued so far)."""
        candidates = sorted(set(self.by_account) - set(self.expected_erased))
        if not candidates:
            return
        writing = watch.execute(
            f'SELECT DISTINCT subject_account_id FROM "{self.s.outbox}".agent_action'
            " WHERE state = 'EXECUTING' AND write_started_at IS NOT NULL"
            " AND subject_account_id = ANY(%s)",
            (candidates,),
        ).fetchall()
        account = self.rng.choice(sorted(r[0] for r in writing) or candidates)
        result = erase_subject(writer, account, schema=self.s.outbox)
        writer.commit()
        # Taken after the commit: a fence asked later than this must have been refused.
        watch.execute(
            f'INSERT INTO "{self.s.watch}".erasure (account, erased, in_flight, committed_at)'
            " VALUES (%s, %s, %s, clock_timestamp())",
            (account, result.erased, result.in_flight),
        )
        self.expected_erased[account] = set(self.by_account[account])
        self.log(f"erased {account}: {result.erased} actions, {result.in_flight} executing")

    def _settle(self, fleet: Fleet, watch: psycopg.Connection[Any]) -> None:
        """Waits (bounded) until no action is waiting or executing."""
        deadline = time.monotonic() + self.o.settle
        while True:
            row = watch.execute(
                f'SELECT count(*) FROM "{self.s.outbox}".agent_action'
                " WHERE state IN ('PROPOSED', 'ADMITTED', 'EXECUTING')"
            ).fetchone()
            live = row[0] if row else 0
            if live == 0:
                self.log("every action ended")
                return
            if time.monotonic() > deadline:
                self.log(f"{live} actions still live after {self.o.settle:.0f}s\n{fleet.logs()}")
                return
            time.sleep(0.5)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def run(options: Options) -> Outcome:
    return Soak(options).run()
