"""An UNCERTAIN email still shows its Message-ID (recorded at the fence, before the relay said
anything), and a delivered one its Message-ID and the relay's queue id; never an address. Real
aiosmtpd relay, real PostgreSQL."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest

from outbox.cli import main
from outbox.operator import attempts_of
from outbox.state import ActionState
from outbox.status import status
from outbox.testing import drain
from tests.email_sink import SmtpSink
from tests.email_support import RECIPIENT, Mail, make_mail

USER, PASSWORD = "relay-user", "s3cret-Pa55word"
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH:UserWarning")


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    server = SmtpSink(USER, PASSWORD).start()
    yield server
    server.stop()


@pytest.fixture
def mail(make_outbox, database_url: str, schema: str, sink: SmtpSink) -> Mail:
    return make_mail(make_outbox, database_url, schema, f"{sink.url}?timeout=1")


def test_an_uncertain_email_shows_its_message_id(
    mail: Mail, sink: SmtpSink, database_url: str, schema: str, capsys
) -> None:
    sink.inject("data", "drop")
    action_id = mail.enqueue(max_attempts=5)
    drain(mail.outbox)
    assert mail.action(action_id).state is ActionState.UNCERTAIN
    [seen] = sink.seen
    message_id = seen.message["Message-ID"]
    with psycopg.connect(database_url) as conn:
        [attempt] = attempts_of(conn, action_id, schema=schema)
        report = status(conn, schema=schema)
    assert (attempt.result, attempt.provider_ref) == ("UNCERTAIN", message_id)
    assert attempt.fence_passed_at is not None
    [listed] = report.latest_uncertain
    assert listed["provider_ref"] == message_id
    assert (
        main(["inspect", str(action_id), "--database-url", database_url, "--schema", schema]) == 0
    )
    out = capsys.readouterr().out
    assert f"provider reference: {message_id}" in out
    assert RECIPIENT not in out.split("attempts on record")[1]


def test_a_delivered_email_keeps_its_message_id_and_queue_id(
    mail: Mail, sink: SmtpSink, database_url: str, schema: str
) -> None:
    action_id = mail.enqueue()
    drain(mail.outbox)
    [received] = sink.accepted
    with psycopg.connect(database_url) as conn:
        [attempt] = attempts_of(conn, action_id, schema=schema)
    assert attempt.result == "DONE"
    assert attempt.provider_ref == f"{received.message['Message-ID']} queue-id=1"
    assert RECIPIENT not in attempt.provider_ref
