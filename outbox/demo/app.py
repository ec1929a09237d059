"""The demo application: the built-in EMAIL kind with three notices about demo people.

People live in ``demo_person`` in the outbox's schema; the notices read it afresh at enqueue time
and before every attempt, so someone who unsubscribes between the two gets nothing.
``make_outbox`` builds it from the environment (``OUTBOX_*``, ``OUTBOX_SMTP_URL``,
``OUTBOX_SMTP_SENDER``): that is what docker-compose's claimer and worker run.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from functools import cache
from typing import Any

from psycopg import sql
from psycopg_pool import ConnectionPool

from outbox import EMAIL, Outbox
from outbox.email import CannotReceive, EmailAdapter, EmailNotice, PreparedEmail, SmtpSettings

PEOPLE_DDL = """
CREATE TABLE IF NOT EXISTS {schema}.demo_person (
    id         bigint PRIMARY KEY,
    name       text NOT NULL,
    email      text,
    subscribed boolean NOT NULL DEFAULT true
)
"""


class People:
    """Reads demo people on a small pool of its own (notices run in worker threads)."""

    def __init__(self, database_url: str, schema: str) -> None:
        self.schema = schema
        self.pool = ConnectionPool(database_url, min_size=1, max_size=4, open=False)
        self._opened = False

    def ensure_table(self, conn: Any) -> None:
        conn.execute(sql.SQL(PEOPLE_DDL).format(schema=sql.Identifier(self.schema)))

    def get(self, person_id: int) -> tuple[str, str | None, bool] | None:
        if not self._opened:
            self.pool.open(wait=True)
            self._opened = True
        with self.pool.connection() as conn:
            row = conn.execute(
                sql.SQL("SELECT name, email, subscribed FROM {}.demo_person WHERE id = %s").format(
                    sql.Identifier(self.schema)
                ),
                (person_id,),
            ).fetchone()
        return row

    def close(self) -> None:
        if self._opened:
            self.pool.close()


class PersonNotice(EmailNotice):
    """A notice to one demo person, who must exist, have an address and be subscribed."""

    subject = ""
    body = ""

    def __init__(self, people: People) -> None:
        self.people = people

    def prepare(self, event: Mapping[str, Any]) -> PreparedEmail | CannotReceive:
        person = self.people.get(int(event["person"]))
        if person is None:
            return CannotReceive("NO_SUCH_PERSON")
        name, email, subscribed = person
        if not email:
            return CannotReceive("NO_ADDRESS")
        if not subscribed:
            return CannotReceive("UNSUBSCRIBED")
        return PreparedEmail(
            to=email,
            to_name=name,
            subject=self.subject.format(name=name, **event),
            text=self.body.format(name=name, **event),
            html=f"<p>{self.body.format(name=name, **event)}</p>",
            unsubscribe_url=f"https://demo.example/unsubscribe/{event['person']}",
        )


class Welcome(PersonNotice):
    name = "welcome"
    subject = "Welcome aboard, {name}"
    body = "Hello {name}, your account is ready."


class Digest(PersonNotice):
    name = "digest"
    subject = "Your weekly digest ({week})"
    body = "Hello {name}, here is what happened in week {week}."
    expires_after = timedelta(days=7)


class PasswordReset(PersonNotice):
    name = "password-reset"
    subject = "Reset your password"
    body = "Hello {name}, use code {code} to reset your password."
    expires_after = timedelta(hours=1)
    max_attempts = 3


def build_outbox(smtp: SmtpSettings, **settings: Any) -> tuple[Outbox, People]:
    outbox = Outbox(**settings)
    people = People(outbox.settings.require_database_url(), outbox.schema)
    notices = [Welcome(people), Digest(people), PasswordReset(people)]
    outbox.register(EMAIL, EmailAdapter(smtp, notices))
    return outbox, people


@cache
def make_outbox() -> Outbox:
    """``outbox.demo.app:make_outbox``: everything from the environment."""
    outbox, _ = build_outbox(SmtpSettings.from_env())
    return outbox
