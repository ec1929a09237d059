"""The soak's mix of actions, decided up front from the seed, and how it is enqueued.

Each planned action says its kind, lane, marker (idempotency key), subject account, whether it
expires soon, and its faults: provider errors before the write (comment store refusals, SMTP 4xx
at RCPT or after DATA), a late 250 from the relay, and pauses after the fence. The harness
enqueues it in small committed batches over the run, and records each committed id in
``<watch>.enqueued``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from benchmarks.chaos.app import SENDER, ChaosNotice
from benchmarks.chaos.comments import COMMENT
from outbox import ActionRequest, Outbox
from outbox.email import SmtpSettings, enqueue_email, message_id_for

#: Share of the mix that is email (at-most-once); the rest is read-back comments.
EMAIL_SHARE = 0.4
#: Attempts before a retried action fails; high, because a kill also costs an attempt.
MAX_ATTEMPTS = 20
#: Subject accounts; a few are erased during the run.
ACCOUNTS = 40
#: Share of actions that have a subject account (the others have none).
ACCOUNT_SHARE = 0.15
#: Share of actions that expire a few seconds after they are enqueued.
EXPIRING_SHARE = 0.05


@dataclass(frozen=True)
class Planned:
    """One action of the mix."""

    n: int
    kind: str  # "email" or "comment"
    marker: str
    lane: str
    account: str | None
    expires_in: float | None
    payload: dict[str, Any] = field(default_factory=dict)
    #: Comment store refusals injected for this marker before it is enqueued.
    comment_faults: int = 0


def plan(actions: int, seed: int) -> list[Planned]:
    """``actions`` actions over at least 200 comment lanes and 100 email lanes."""
    rng = random.Random(seed)
    emails = int(actions * EMAIL_SHARE)
    comment_lanes = max(200, (actions - emails) // 8)
    email_lanes = max(100, emails // 8)
    mix: list[Planned] = []
    for n in range(actions):
        account = f"acct-{rng.randrange(ACCOUNTS)}" if rng.random() < ACCOUNT_SHARE else None
        expires_in = rng.uniform(1.0, 4.0) if rng.random() < EXPIRING_SHARE else None
        linger = rng.uniform(0.3, 0.7) if rng.random() < 0.08 else 0.0
        if n % 5 < 2:  # two in five: EMAIL_SHARE
            roll = rng.random()
            fault = (
                f"r{rng.randint(1, 2)}"
                if roll < 0.10
                else f"d{rng.randint(1, 2)}"
                if roll < 0.20
                else "s"
                if roll < 0.28
                else ""
            )
            event: dict[str, Any] = {"n": n, "fault": fault}
            if linger:
                event["linger"] = round(linger, 2)
            mix.append(
                Planned(
                    n,
                    "email",
                    f"chaos-mail-{n}",
                    f"mail-{rng.randrange(email_lanes)}",
                    account,
                    expires_in,
                    event,
                )
            )
        else:
            payload: dict[str, Any] = {}
            if linger:
                payload["linger"] = round(linger, 2)
            if rng.random() < 0.08:
                payload["linger_after"] = round(rng.uniform(0.3, 0.7), 2)
            faults = rng.randint(1, 2) if rng.random() < 0.15 else 0
            mix.append(
                Planned(
                    n,
                    "comment",
                    f"chaos-comment-{n}",
                    f"thread-{rng.randrange(comment_lanes)}",
                    account,
                    expires_in,
                    payload,
                    faults,
                )
            )
    return mix


def sender_message_id(marker: str) -> str:
    """The Message-ID the email with this idempotency key carries."""
    return message_id_for(
        marker, SmtpSettings.from_url("smtp://127.0.0.1", SENDER).sender_address()
    )


def inject_comment_faults(conn: psycopg.Connection[Any], world: str, mix: list[Planned]) -> int:
    """Arms the comment store's refusals; returns how many were armed."""
    rows = [(p.marker, p.comment_faults) for p in mix if p.comment_faults]
    with conn.cursor() as cur:
        cur.executemany(
            f'INSERT INTO "{world}".comment_fault (marker, remaining) VALUES (%s, %s)', rows
        )
    return sum(n for _, n in rows)


def enqueue_batch(
    conn: psycopg.Connection[Any], outbox: Outbox, watch: str, batch: list[Planned]
) -> list[tuple[Planned, int]]:
    """Enqueues ``batch`` in one transaction (committed here); returns each with its id."""
    notice = ChaosNotice()
    done: list[tuple[Planned, int]] = []
    now = datetime.now(UTC)
    for p in batch:
        expires_at = now + timedelta(seconds=p.expires_in) if p.expires_in else None
        if p.kind == "email":
            action = enqueue_email(
                conn,
                notice,
                p.payload,
                idempotency_key=p.marker,
                lane_key=p.lane,
                subject_account_id=p.account,
                max_attempts=MAX_ATTEMPTS,
                expires_at=expires_at,
                schema=outbox.schema,
            )
        else:
            action = outbox.enqueue(
                conn,
                ActionRequest(
                    kind=COMMENT.name,
                    workspace_id="w1",
                    lane_key=p.lane,
                    idempotency_key=p.marker,
                    payload=p.payload,
                    subject_account_id=p.account,
                    max_attempts=MAX_ATTEMPTS,
                    expires_at=expires_at,
                ),
            )
        done.append((p, action.id))
    with conn.cursor() as cur:
        cur.executemany(
            f'INSERT INTO "{watch}".enqueued (action_id, kind, marker, lane, account, expires,'
            " message_id) VALUES (%s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    action_id,
                    p.kind,
                    p.marker,
                    p.lane,
                    p.account,
                    p.expires_in is not None,
                    sender_message_id(p.marker) if p.kind == "email" else None,
                )
                for p, action_id in done
            ],
        )
    conn.commit()
    return done
