"""A notice backed by a real table of the application, and helpers for the email tests."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import psycopg

from outbox import EMAIL, Action, Outbox, get_action
from outbox.email import (
    CannotReceive,
    EmailAdapter,
    EmailNotice,
    PreparedEmail,
    SmtpSettings,
    enqueue_email,
)
from outbox.executor import Outcome
from outbox.testing import make_due

SENDER = "Outbox Tests <noreply@mail.example.com>"
RECIPIENT = "ada.lovelace@people.example.org"


class MemberNotice(EmailNotice):
    """A welcome email to a workspace member, read from ``app_member`` on every prepare: an
    unsubscribed member, one whose role is gone, or one without an address gets nothing."""

    name = "member-welcome"

    def __init__(self, database_url: str, schema: str) -> None:
        self.database_url = database_url
        self.schema = schema
        self.prepared = 0

    def prepare(self, event: Mapping[str, Any]) -> PreparedEmail | CannotReceive:
        self.prepared += 1
        with psycopg.connect(self.database_url) as conn:
            row = conn.execute(
                f'SELECT email, subscribed, role FROM "{self.schema}".app_member '
                "WHERE account_id = %s",
                (event["account_id"],),
            ).fetchone()
        if row is None or not row[0]:
            return CannotReceive("NO_ADDRESS")
        email, subscribed, role = row
        if not subscribed:
            return CannotReceive("UNSUBSCRIBED")
        if role != "member":
            return CannotReceive("ROLE_REMOVED")
        return PreparedEmail(
            to=email,
            to_name=event.get("name"),
            subject=f"Welcome, {event.get('name', 'member')}",
            text="You joined the workspace.\n",
            html="<p>You joined the workspace.</p>",
            unsubscribe_url=f"https://app.example.com/unsubscribe/{event['account_id']}",
        )


def create_members(database_url: str, schema: str) -> None:
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f'CREATE TABLE "{schema}".app_member (account_id text PRIMARY KEY, email text, '
            "subscribed boolean NOT NULL DEFAULT true, role text NOT NULL DEFAULT 'member')"
        )


def add_member(
    database_url: str, schema: str, account_id: str, email: str | None, **columns: Any
) -> None:
    names = ["account_id", "email", *columns]
    values = [account_id, email, *columns.values()]
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".app_member ({", ".join(names)}) '
            f"VALUES ({', '.join(['%s'] * len(values))})",
            values,
        )


def set_member(database_url: str, schema: str, account_id: str, **columns: Any) -> None:
    sets = ", ".join(f"{name} = %s" for name in columns)
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f'UPDATE "{schema}".app_member SET {sets} WHERE account_id = %s',
            [*columns.values(), account_id],
        )


def run_one_round(outbox: Outbox) -> list[Outcome]:
    """One claim-and-run round (what ``drain`` repeats), so a test can act between attempts."""

    async def round_() -> list[Outcome]:
        async with outbox.store() as store:
            await make_due(store)
            return await outbox.claim_and_run(outbox.executor(store))

    return asyncio.run(round_())


@dataclass
class Mail:
    """One test's outbox with an EmailAdapter on the sink, and a member who can receive."""

    outbox: Outbox
    notice: MemberNotice
    adapter: EmailAdapter
    database_url: str
    schema: str

    def enqueue(self, account_id: str = "a1", **kwargs) -> int:
        with psycopg.connect(self.database_url) as conn:
            action = enqueue_email(
                conn,
                self.notice,
                {"account_id": account_id, "name": "Ada"},
                subject_account_id=account_id,
                schema=self.schema,
                **kwargs,
            )
            conn.commit()
        return action.id

    def action(self, action_id: int) -> Action:
        with psycopg.connect(self.database_url) as conn:
            return get_action(conn, action_id, schema=self.schema)


def make_mail(make_outbox, database_url: str, schema: str, smtp_url: str, **smtp) -> Mail:
    outbox = make_outbox()
    notice = MemberNotice(database_url, schema)
    adapter = EmailAdapter(SmtpSettings.from_url(smtp_url, SENDER, **smtp), [notice])
    outbox.register(EMAIL, adapter)
    outbox.migrate()
    create_members(database_url, schema)
    add_member(database_url, schema, "a1", RECIPIENT)
    return Mail(outbox, notice, adapter, database_url, schema)
