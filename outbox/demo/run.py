"""``outbox demo``: migrate, enqueue a realistic mix of emails, webhooks and issue comments, run a
claimer and a Dramatiq worker pool until every action ended, and print the outcomes.

Defaults are embedded: PostgreSQL from the ``pgserver`` package when no database URL is set,
Dramatiq's in-process ``StubBroker`` when no broker URL is set, and an in-process SMTP sink with
injected faults when no SMTP URL is set. With URLs set, the same run uses real servers. The
webhook receiver and the issue tracker are always in-process, on loopback.
"""

from __future__ import annotations

import asyncio
import os
import random
import shutil
import sys
import tempfile
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import psycopg
from psycopg import sql

from outbox import event_loop
from outbox.demo.app import Digest, PasswordReset, People, Welcome, build_outbox
from outbox.demo.schema import DEMO_SCHEMA, fresh_demo_schema, record_demo_actions
from outbox.email import RecipientCannotReceive, SmtpSettings, enqueue_email
from outbox.errors import ConfigurationError
from outbox.issue_comment import (
    ISSUE_COMMENT,
    IssueCommentAdapter,
    IssueCommentSettings,
    enqueue_issue_comment,
)
from outbox.webhook import (
    WEBHOOK,
    AddressPolicy,
    WebhookAdapter,
    WebhookSettings,
    add_subscription,
    enqueue_webhook,
    new_secret,
)

SENDER = "Outbox Demo <noreply@demo.example>"


@dataclass
class DemoResult:
    enqueued: int = 0
    refused_at_enqueue: Counter[str] = field(default_factory=Counter)
    outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    accepted_by_sink: int | None = None
    duplicates_at_sink: int | None = None
    seconds: float = 0.0
    where: dict[str, str] = field(default_factory=dict)
    #: Ended emails by (state, reason): what the SMTP sink's count is compared with.
    email_outcomes: Counter[tuple[str, str]] = field(default_factory=Counter)
    webhooks_enqueued: int = 0
    webhooks_accepted: int = 0
    webhook_bad_signatures: int = 0
    comments_enqueued: int = 0
    comments_posted: int = 0
    comment_duplicates: int = 0
    schema: str = DEMO_SCHEMA

    @property
    def all_ended(self) -> bool:
        return sum(self.outcomes.values()) == self.enqueued


@contextmanager
def _database(url: str | None) -> Iterator[tuple[str, str]]:
    """The given URL, or an embedded PostgreSQL (pgserver) in a temporary directory."""
    if url:
        yield url, "PostgreSQL at OUTBOX_DATABASE_URL"
        return
    try:
        warnings.filterwarnings("ignore", module="platformdirs")
        from pgserver.postgres_server import get_server
    except ImportError:
        raise ConfigurationError(
            "no OUTBOX_DATABASE_URL and no embedded PostgreSQL: pip install 'outbox[embedded]' "
            "(make demo does), or set OUTBOX_DATABASE_URL"
        ) from None
    # pgserver's platformdirs warns when XDG_RUNTIME_DIR is unset (root on a server): harmless.
    warnings.filterwarnings("ignore", module="platformdirs")
    datadir = tempfile.mkdtemp(prefix="outbox-demo-pg-")
    server = get_server(datadir, cleanup_mode="stop")
    try:
        yield server.get_uri(), f"embedded PostgreSQL (pgserver) in {datadir}"
    finally:
        server.cleanup()
        shutil.rmtree(datadir, ignore_errors=True)


@contextmanager
def _smtp(url: str | None) -> Iterator[tuple[SmtpSettings, Any]]:
    if url:
        yield SmtpSettings.from_url(url, os.environ.get("OUTBOX_SMTP_SENDER", SENDER)), None
        return
    from outbox.demo.sink import FaultySink

    sink = FaultySink()
    sink_url = sink.start()
    try:
        yield SmtpSettings.from_url(sink_url, SENDER), sink
    finally:
        sink.stop()


def _broker(url: str | None) -> tuple[Any, str]:
    if url:
        from outbox.dispatch.broker import broker_from_url

        return broker_from_url(url), "Dramatiq broker at OUTBOX_BROKER_URL"
    from dramatiq.brokers.stub import StubBroker

    broker = StubBroker()
    broker.emit_after("process_boot")
    return broker, "Dramatiq's in-process StubBroker"


def _people(n: int, rng: random.Random) -> list[tuple[int, str, str | None, bool]]:
    """Demo people: most ordinary, some whose relay misbehaves, a few without an address or
    unsubscribed."""
    people = []
    for i in range(1, n + 1):
        domain = (
            "flaky.example"
            if i % 13 == 3
            else "gone.example"
            if i % 29 == 7
            else "slow.example"
            if i % 47 == 11
            else "example.org"
        )
        email = None if rng.random() < 0.02 else f"person{i}@{domain}"
        subscribed = rng.random() > 0.04
        people.append((i, f"Person {i}", email, subscribed))
    return people


def _enqueue(
    conn: psycopg.Connection[Any],
    people_rows: list[Any],
    notices: list[Any],
    result: DemoResult,
    schema: str,
) -> None:
    rng = random.Random(7)
    ids: list[int] = []
    for person_id, _name, _email, _subscribed in people_rows:
        for notice in rng.sample(notices, k=rng.choice((1, 1, 2))):
            event: dict[str, Any] = {"person": person_id}
            if isinstance(notice, Digest):
                event["week"] = "2026-W48"
            if isinstance(notice, PasswordReset):
                event["code"] = f"{rng.randrange(10**6):06d}"
            try:
                action = enqueue_email(
                    conn,
                    notice,
                    event,
                    lane_key=f"person:{person_id}",
                    subject_account_id=person_id,
                    schema=schema,
                )
                ids.append(action.id)
                result.enqueued += 1
            except RecipientCannotReceive as refused:
                result.refused_at_enqueue[refused.reason] += 1
    record_demo_actions(conn, schema, ids)
    conn.commit()


def _progress(done: int, total: int, states: Counter[str], started: float) -> None:
    """A bar redrawn in place on a terminal; a plain line a second otherwise (CI logs)."""
    tty = sys.stderr.isatty()
    elapsed = time.monotonic() - started
    if not tty and done < total and int(elapsed * 4) % 4:
        return
    width = 32
    filled = int(width * done / total) if total else width
    summary = " ".join(f"{s.lower()}={n}" for s, n in sorted(states.items()))
    line = (
        f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} ended {elapsed:5.1f}s  {summary}"
    )
    sys.stderr.write(f"\r{line}\033[K" if tty else f"{line}\n")
    sys.stderr.flush()


def _counts(
    conn: psycopg.Connection[Any], schema: str
) -> tuple[Counter[str], Counter[tuple[str, str]], Counter[tuple[str, str]]]:
    rows = conn.execute(
        sql.SQL(
            "SELECT kind, state, coalesce(stop_reason, ''), count(*) FROM {}.agent_action "
            "GROUP BY 1, 2, 3"
        ).format(sql.Identifier(schema))
    ).fetchall()
    states: Counter[str] = Counter()
    ended: Counter[tuple[str, str]] = Counter()
    emails: Counter[tuple[str, str]] = Counter()
    for kind, state, reason, n in rows:
        states[state] += n
        if reason:
            ended[(state, reason)] += n
            if kind == "EMAIL":
                emails[(state, reason)] += n
    return states, ended, emails


@contextmanager
def _receivers() -> Iterator[tuple[Any, Any, str]]:
    """The in-process webhook receiver and issue tracker, and the webhook secret."""
    from outbox.demo.receivers import IssueTracker, WebhookReceiver

    secret = new_secret()
    receiver, tracker = WebhookReceiver(secret), IssueTracker()
    receiver.url, tracker.url = receiver.start(), tracker.start()  # type: ignore[attr-defined]
    try:
        yield receiver, tracker, secret
    finally:
        receiver.stop()
        tracker.stop()


def _register_http_kinds(outbox: Any, db_url: str, tracker_url: str, schema: str) -> None:
    from outbox.demo.receivers import TOKEN

    webhook_settings = WebhookSettings(
        # The demo's receiver is on loopback, which the guard refuses unless allowed.
        address_policy=AddressPolicy.parse("127.0.0.0/8"),
        timeout=timedelta(seconds=2),
    )
    outbox.register(WEBHOOK, WebhookAdapter(db_url, schema=schema, settings=webhook_settings))
    comments = IssueCommentSettings(token=TOKEN, api_url=tracker_url, timeout=timedelta(seconds=2))
    outbox.register(ISSUE_COMMENT, IssueCommentAdapter(comments))


def _enqueue_http(
    conn: psycopg.Connection[Any],
    people_rows: list[Any],
    webhook_url: str,
    secret: str,
    result: DemoResult,
    schema: str,
) -> None:
    """A webhook for every fifth person who joined, and a comment on a support issue for every
    seventh, each in the transaction that records it."""
    add_subscription(conn, f"{webhook_url}/hooks", [secret], ["person.joined"], schema=schema)
    ids: list[int] = []
    for person_id, *_ in people_rows:
        if person_id % 5 == 0:
            webhooks = enqueue_webhook(
                conn,
                "person.joined",
                {"person": person_id},
                idempotency_key=f"person:{person_id}:joined",
                schema=schema,
            )
            ids += [action.id for action in webhooks]
            result.webhooks_enqueued += len(webhooks)
        if person_id % 7 == 0:
            comment = enqueue_issue_comment(
                conn,
                "demo",
                "support",
                1 + person_id % 3,
                f"Person {person_id} confirmed the fix.",
                idempotency_key=f"person:{person_id}:confirmed",
                workspace_id="demo",
                schema=schema,
            )
            ids.append(comment.id)
            result.comments_enqueued += 1
    result.enqueued += result.webhooks_enqueued + result.comments_enqueued
    record_demo_actions(conn, schema, ids)
    conn.commit()


def run_demo(
    people: int = 200, timeout: float = 120.0, progress: bool = True, schema: str = DEMO_SCHEMA
) -> DemoResult:
    """Runs the whole demo in ``schema`` and returns what happened (``outbox demo`` prints it).

    The schema is the demo's own: created and marked by it, dropped by its next run; one that
    exists without the demo's mark, or holds actions the demo did not enqueue, is refused
    (``DemoSchemaRefused``) before anything is written."""
    import dramatiq

    from outbox.dispatch.actors import install
    from outbox.dispatch.claimer import Claimer

    result = DemoResult(schema=schema)
    env = os.environ
    with ExitStack() as stack:
        db_url, db_where = stack.enter_context(
            _database(env.get("OUTBOX_DATABASE_URL") or env.get("DATABASE_URL"))
        )
        smtp, sink = stack.enter_context(_smtp(env.get("OUTBOX_SMTP_URL")))
        receiver, tracker, secret = stack.enter_context(_receivers())
        broker, broker_where = _broker(env.get("OUTBOX_BROKER_URL"))
        result.where = {
            "database": db_where,
            "broker": broker_where,
            "smtp": "in-process SMTP sink with injected faults" if sink else "OUTBOX_SMTP_URL",
            "http": "in-process webhook receiver and issue tracker that lose some answers",
        }
        outbox, people_source = build_outbox(
            smtp,
            database_url=db_url,
            schema=schema,
            lease=timedelta(seconds=20),
            write_margin=timedelta(seconds=5),
            retry_base=timedelta(seconds=0.3),
            retry_cap=timedelta(seconds=2),
            poll_interval=timedelta(seconds=0.2),
            housekeeping_interval=timedelta(seconds=1),
            in_flight=32,
            batch_size=32,
        )
        stack.callback(people_source.close)
        _register_http_kinds(outbox, db_url, tracker.url, schema)
        _prepare_database(db_url, outbox, people_source, people, result)
        with psycopg.connect(db_url) as conn:
            people_rows = _people(people, random.Random(42))
            _enqueue_http(conn, people_rows, receiver.url, secret, result, schema)
        started = time.monotonic()
        dispatch = install(outbox, broker)
        worker = dramatiq.Worker(broker, worker_threads=8, worker_timeout=100)
        worker.start()
        try:
            event_loop.run(
                _claim_until_settled(
                    outbox, dispatch, Claimer, db_url, result, started, timeout, progress
                ),
                outbox.settings.event_loop,
            )
        finally:
            worker.stop()
        result.seconds = time.monotonic() - started
        if sink is not None:
            result.accepted_by_sink = sink.total()
            result.duplicates_at_sink = sink.duplicates()
        result.webhooks_accepted = receiver.accepted()
        result.webhook_bad_signatures = receiver.bad_signatures
        markers = tracker.markers()
        result.comments_posted = len(markers)
        result.comment_duplicates = sum(n - 1 for n in markers.values())
    return result


def _prepare_database(
    db_url: str, outbox: Any, people_source: People, people: int, result: DemoResult
) -> None:
    fresh_demo_schema(db_url, result.schema)
    outbox.migrate()
    rows = _people(people, random.Random(42))
    with psycopg.connect(db_url) as conn:
        people_source.ensure_table(conn)
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL("INSERT INTO {}.demo_person VALUES (%s, %s, %s, %s)").format(
                    sql.Identifier(result.schema)
                ),
                rows,
            )
        conn.commit()
        notices = [Welcome(people_source), Digest(people_source), PasswordReset(people_source)]
        _enqueue(conn, rows, notices, result, result.schema)
        # Some people unsubscribe after their email was enqueued: the adapter prepares again
        # before the attempt and cancels it, so they get nothing.
        conn.execute(
            sql.SQL("UPDATE {}.demo_person SET subscribed = false WHERE id % 17 = 0").format(
                sql.Identifier(result.schema)
            )
        )
        conn.commit()


async def _claim_until_settled(
    outbox: Any,
    dispatch: Any,
    claimer_class: Any,
    db_url: str,
    result: DemoResult,
    started: float,
    timeout: float,
    progress: bool,
) -> None:
    stop = asyncio.Event()
    async with outbox.store() as store:
        claimer = claimer_class(dispatch, store)
        task = asyncio.create_task(claimer.run(stop))
        try:
            with psycopg.connect(db_url, autocommit=True) as conn:
                while True:
                    states, ended, emails = _counts(conn, result.schema)
                    done = sum(ended.values())
                    if progress:
                        _progress(done, result.enqueued, states, started)
                    if done >= result.enqueued or time.monotonic() - started > timeout:
                        result.outcomes, result.email_outcomes = ended, emails
                        break
                    await asyncio.sleep(0.25)
        finally:
            stop.set()
            await task
            if progress and sys.stderr.isatty():
                sys.stderr.write("\n")


def render(result: DemoResult) -> str:
    lines = ["", "outbox demo: outcomes", ""]
    lines.append(f"  {'state':<10} {'reason':<34} {'actions':>7}")
    lines.append(f"  {'-' * 10} {'-' * 34} {'-' * 7}")
    for (state, reason), n in sorted(result.outcomes.items(), key=lambda x: (x[0][0], -x[1])):
        lines.append(f"  {state:<10} {reason:<34} {n:>7}")
    ended = sum(result.outcomes.values())
    lines.append(f"  {'':<10} {'ended':<34} {ended:>7} of {result.enqueued} enqueued")
    for reason, n in sorted(result.refused_at_enqueue.items()):
        lines.append(f"  {'(refused)':<10} {'not enqueued: ' + reason:<34} {n:>7}")
    if result.accepted_by_sink is not None:
        lines.append("")
        lines.append(
            f"  SMTP sink accepted {result.accepted_by_sink} messages, "
            f"{result.duplicates_at_sink} of them twice (the outbox's promise: 0)."
        )
    lines.append(
        f"  Webhook receiver took {result.webhooks_accepted} of {result.webhooks_enqueued} events "
        "(each webhook-id once, however often resent after a lost answer)."
    )
    lines.append(
        f"  Issue tracker holds {result.comments_posted} of {result.comments_enqueued} comments, "
        f"{result.comment_duplicates} of them twice (read back after a lost answer; promise: 0)."
    )
    lines.append(f"  {result.seconds:.1f}s on {', '.join(result.where.values())}.")
    lines += [
        "",
        "What the outcomes mean:",
        "  DONE      the relay accepted the message (readback_ref: Message-ID, queue id), the",
        "            receiver took the webhook, or the comment is on the issue",
        "  FAILED    the relay refused it for good (5xx), or every retry hit a 4xx",
        "  CANCELLED the person unsubscribed after the email was enqueued",
        "  UNCERTAIN the relay got the message but its reply timed out: never sent again",
        "",
        "Where to look next:",
    ]
    if result.where.get("database", "").startswith("embedded"):
        lines += [
            "  The embedded database is gone with the demo. To look around afterwards, run it",
            "  on your PostgreSQL: OUTBOX_DATABASE_URL=postgresql://... outbox demo, then",
        ]
    where = f"--schema {result.schema}"
    lines += [
        f"  outbox status {where}      counts, backlog, latest UNCERTAIN/FAILED",
        f"  outbox inspect ID {where}  one action's fields and history",
        f"  outbox dashboard {where}   the same as a web page",
        "  README.md: 'Five minutes: add a kind and its adapter'",
    ]
    return "\n".join(lines)


def main(people: int = 200, timeout: float = 120.0, schema: str = DEMO_SCHEMA) -> int:
    result = run_demo(people=people, timeout=timeout, schema=schema)
    print(render(result))
    if not result.all_ended:
        print(f"\nNot every action ended within {timeout:.0f}s.", file=sys.stderr)
        return 1
    if result.duplicates_at_sink or result.comment_duplicates:
        print("\nA message was accepted twice: that is a bug, please report it.", file=sys.stderr)
        return 1
    return 0
