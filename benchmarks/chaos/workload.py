"""The soak's mix of actions, decided up front from the seed, and how it is enqueued.

Each planned item says its kind, lane, idempotency key, subject account, whether it expires
soon, its pauses and its provider fault: for email a 4xx at RCPT or after DATA or a late 250
(``app.recipient``); for the HTTP kinds one of ``receivers``' faults on the first write (a 500
or a reset after the write, an answer past the client's timeout, a 429). A webhook item is one
event, delivered to the two subscriptions of its event type (two actions). The harness enqueues
the items in small committed batches over the run and records each committed action in
``<watch>.enqueued``.
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg

from benchmarks.chaos.app import SENDER, ChaosNotice
from outbox import Action, Outbox
from outbox.chat_reply import chat_reply_request
from outbox.chat_reply import marker_of as chat_marker
from outbox.email import SmtpSettings, enqueue_email, message_id_for
from outbox.issue_comment import issue_comment_request
from outbox.issue_comment import marker_of as issue_marker
from outbox.webhook import enqueue_webhook, webhook_id
from outbox.webhook.enqueue import webhook_requests

#: Of every 9 items: 4 emails, 1 webhook event (2 actions), 2 issue comments, 2 chat replies;
#: so 40% of the actions are email and 20% each of the read-back kinds.
PATTERN = ("email",) * 4 + ("webhook",) + ("issue_comment",) * 2 + ("chat_reply",) * 2
#: Attempts before a retried action fails; high, because a kill also costs an attempt.
MAX_ATTEMPTS = 20
#: Subject accounts; a few are erased during the run.
ACCOUNTS = 40
#: Share of actions that have a subject account (the others have none).
ACCOUNT_SHARE = 0.15
#: Share of actions that expire a few seconds after they are enqueued.
EXPIRING_SHARE = 0.05
#: Webhook event types; subscription slot i takes type ``i % EVENT_TYPES``, so each event goes
#: to WEBHOOK_SLOTS / EVENT_TYPES subscriptions (each a lane of its own).
EVENT_TYPES = 32
WEBHOOK_SLOTS = 64
#: The issue every thread reply of the chat answers to.
THREAD_TS = "1700000000.000100"
#: The HTTP kinds' faults on the first write (``receivers``), with their odds.
HTTP_FAULTS = (("e", 0.07), ("x", 0.05), ("t", 0.04), ("r", 0.05))


def event_type(n: int) -> str:
    return f"chaos.t{n % EVENT_TYPES}"


@dataclass(frozen=True)
class Planned:
    """One item of the mix (a webhook item is one event: two actions)."""

    n: int
    kind: str  # "email", "webhook", "issue_comment" or "chat_reply"
    key: str
    lane: str
    account: str | None
    expires_in: float | None
    payload: dict[str, Any] = field(default_factory=dict)
    fault: str = ""

    @property
    def actions(self) -> int:
        return WEBHOOK_SLOTS // EVENT_TYPES if self.kind == "webhook" else 1


def _http_fault(rng: random.Random) -> str:
    roll = rng.random()
    for fault, odds in HTTP_FAULTS:
        if roll < odds:
            return fault
        roll -= odds
    return ""


def plan(actions: int, seed: int) -> list[Planned]:
    """Items of ``actions`` actions in all over at least 100 email lanes, 120 issues, 80 chat
    channels and the webhook subscriptions."""
    rng = random.Random(seed)
    email_lanes = max(100, actions * 4 // 10 // 8)
    issues = max(120, actions * 2 // 10 // 6)
    channels = max(80, actions * 2 // 10 // 8)
    mix: list[Planned] = []
    total = 0
    for n in itertools.count():
        if total >= actions:
            break
        kind = PATTERN[n % len(PATTERN)]
        if kind == "webhook" and total + WEBHOOK_SLOTS // EVENT_TYPES > actions:
            kind = "issue_comment"
        account = f"acct-{rng.randrange(ACCOUNTS)}" if rng.random() < ACCOUNT_SHARE else None
        expires_in = rng.uniform(1.0, 4.0) if rng.random() < EXPIRING_SHARE else None
        chaos: dict[str, Any] = {}
        if rng.random() < 0.08:
            chaos["linger"] = round(rng.uniform(0.3, 0.6), 2)
        if kind == "email":
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
            event: dict[str, Any] = {"n": n, "fault": fault, **chaos}
            item = Planned(
                n,
                kind,
                f"chaos-mail-{n}",
                f"mail-{rng.randrange(email_lanes)}",
                account,
                expires_in,
                event,
                fault,
            )
        else:
            if rng.random() < 0.08:
                chaos["linger_after"] = round(rng.uniform(0.3, 0.6), 2)
            fault = _http_fault(rng)
            lane = {
                "webhook": "",
                "issue_comment": f"{rng.randrange(issues)}",
                "chat_reply": f"C{rng.randrange(channels):04d}",
            }[kind]
            payload: dict[str, Any] = {"chaos": chaos} if chaos else {}
            if kind == "chat_reply" and rng.random() < 0.5:
                payload["thread_ts"] = THREAD_TS
            item = Planned(n, kind, f"chaos-{kind}-{n}", lane, account, expires_in, payload, fault)
        mix.append(item)
        total += item.actions
    return mix


def sender_message_id(marker: str) -> str:
    """The Message-ID the email with this idempotency key carries."""
    return message_id_for(
        marker, SmtpSettings.from_url("smtp://127.0.0.1", SENDER).sender_address()
    )


@dataclass(frozen=True)
class Enqueued:
    """One committed action and what the checks know it by."""

    item: Planned
    action_id: int
    marker: str
    lane: str
    effect_key: str


def _text(p: Planned) -> str:
    fault = f" [fault:{p.fault}]" if p.fault else ""
    return f"Comment {p.n} of the chaos soak.{fault}"


def _enqueue_one(
    conn: psycopg.Connection[Any],
    outbox: Outbox,
    p: Planned,
    slots: dict[int, str],
    expires_at: datetime | None,
) -> list[Enqueued]:
    schema = outbox.schema
    if p.kind == "email":
        action = enqueue_email(
            conn,
            ChaosNotice(),
            p.payload,
            idempotency_key=p.key,
            lane_key=p.lane,
            subject_account_id=p.account,
            max_attempts=MAX_ATTEMPTS,
            expires_at=expires_at,
            schema=schema,
        )
        return [Enqueued(p, action.id, p.key, p.lane, sender_message_id(p.key))]
    if p.kind == "webhook":
        data = {"key": p.key, "fault": p.fault, **p.payload}
        actions: list[Action]
        if p.account is None:
            actions = enqueue_webhook(
                conn,
                event_type(p.n),
                data,
                idempotency_key=p.key,
                max_attempts=MAX_ATTEMPTS,
                expires_at=expires_at,
                schema=schema,
            )
        else:
            # enqueue_webhook takes no subject account: the same requests, each with one.
            kind_of = p.n % EVENT_TYPES
            matching = [sid for sid, slot in slots.items() if int(slot) % EVENT_TYPES == kind_of]
            requests = webhook_requests(
                sorted(matching),
                event_type(p.n),
                data,
                idempotency_key=p.key,
                occurred_at=datetime.now(UTC),
                max_attempts=MAX_ATTEMPTS,
                expires_at=expires_at,
            )
            actions = outbox.enqueue_many(
                conn, [replace(r, subject_account_id=p.account) for r in requests]
            )
        return [
            Enqueued(
                p,
                a.id,
                f"{p.key}@{slots[a.payload['subscription']]}",
                a.lane_key,
                webhook_id(a.idempotency_key),
            )
            for a in actions
        ]
    if p.kind == "issue_comment":
        request = issue_comment_request(
            "chaos",
            "soak",
            int(p.lane) + 1,
            _text(p),
            idempotency_key=p.key,
            workspace_id="w1",
            max_attempts=MAX_ATTEMPTS,
            expires_at=expires_at,
        )
        effect = issue_marker(p.key).removeprefix("<!-- outbox:").removesuffix(" -->")
    else:
        request = chat_reply_request(
            p.lane,
            _text(p),
            idempotency_key=p.key,
            workspace_id="w1",
            thread_ts=p.payload.get("thread_ts"),
            max_attempts=MAX_ATTEMPTS,
            expires_at=expires_at,
        )
        effect = chat_marker(p.key)
    chaos = p.payload.get("chaos")
    request = replace(
        request,
        subject_account_id=p.account,
        payload={**request.payload, **({"chaos": chaos} if chaos else {})},
    )
    action = outbox.enqueue(conn, request)
    return [Enqueued(p, action.id, p.key, action.lane_key, effect)]


def enqueue_batch(
    conn: psycopg.Connection[Any],
    outbox: Outbox,
    watch: str,
    batch: list[Planned],
    slots: dict[int, str],
) -> list[Enqueued]:
    """Enqueues ``batch`` in one transaction (committed here); returns each action.
    ``slots``: the receiver's slot of each webhook subscription id."""
    done: list[Enqueued] = []
    now = datetime.now(UTC)
    for p in batch:
        expires_at = now + timedelta(seconds=p.expires_in) if p.expires_in else None
        done += _enqueue_one(conn, outbox, p, slots, expires_at)
    with conn.cursor() as cur:
        cur.executemany(
            f'INSERT INTO "{watch}".enqueued (action_id, kind, marker, lane, account, expires,'
            " effect_key, fault) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)",
            [
                (
                    e.action_id,
                    e.item.kind,
                    e.marker,
                    e.lane,
                    e.item.account,
                    e.item.expires_in is not None,
                    e.effect_key,
                    e.item.fault,
                )
                for e in done
            ],
        )
    conn.commit()
    return done
