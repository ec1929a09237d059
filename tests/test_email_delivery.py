"""EmailAdapter against a real aiosmtpd relay with injected faults, on a real PostgreSQL schema.

Every test enqueues with ``enqueue_email``, runs the actions with ``outbox.testing.drain`` (or
one round at a time), and asserts the action's final state and stop reason and what the relay
really received.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest

from outbox import EMAIL, ActionRequest, ActionState, enqueue
from outbox.email import (
    RecipientCannotReceive,
    SmtpSettings,
    enqueue_email_async,
    message_id_for,
)
from outbox.results import Abandoned, Defer, Done, Failed, Retry
from outbox.testing import drain
from tests.email_sink import SmtpSink, free_port
from tests.email_support import (
    RECIPIENT,
    SENDER,
    Mail,
    add_member,
    make_mail,
    run_one_round,
    set_member,
)

USER, PASSWORD = "relay-user", "s3cret-Pa55word"

# The test relay takes AUTH without TLS (aiosmtpd warns); the TLS path is tested on its own.
pytestmark = pytest.mark.filterwarnings("ignore:Requiring AUTH:UserWarning")


@pytest.fixture
def sink() -> Iterator[SmtpSink]:
    server = SmtpSink(USER, PASSWORD).start()
    yield server
    server.stop()


@pytest.fixture
def mail(make_outbox, database_url: str, schema: str, sink: SmtpSink) -> Mail:
    # A short reply timeout keeps the slow-relay test fast; every other reply is immediate.
    return make_mail(make_outbox, database_url, schema, f"{sink.url}?timeout=1")


def results(report) -> list[tuple[str, str | None]]:
    return [(type(o.result).__name__, getattr(o.result, "reason", None)) for o in report.outcomes]


def test_delivered_email_is_done_with_the_relays_reply_and_every_required_header(
    mail: Mail, sink: SmtpSink
) -> None:
    action_id = mail.enqueue()
    report = drain(mail.outbox)

    action = mail.action(action_id)
    assert action.state is ActionState.DONE
    assert results(report) == [("Done", None)]
    [received] = sink.accepted
    assert received.rcpt_tos == (RECIPIENT,)
    assert received.mail_from == "noreply@mail.example.com"
    assert action.readback_ref == f"{received.message['Message-ID']} queue-id=1"
    message = received.message
    assert message["Message-ID"] == message_id_for(
        action.idempotency_key, SmtpSettings.from_url(sink.url, SENDER).sender_address()
    )
    assert message["Message-ID"].endswith("@mail.example.com>")
    assert message["Auto-Submitted"] == "auto-generated"
    assert message["X-Auto-Response-Suppress"] == "All"
    assert message["List-Unsubscribe"] == "<https://app.example.com/unsubscribe/a1>"
    assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert message["To"] == f"Ada <{RECIPIENT}>"
    assert message["Subject"] == "Welcome, Ada"
    assert message.get_body(("plain",)).get_content().strip() == "You joined the workspace."
    assert "<p>You joined" in message.get_body(("html",)).get_content()
    # The payload never held the rendered message, and an ended action keeps none at all.
    assert action.payload is None


def test_payload_holds_only_the_notice_name_and_event_and_the_email_expires(mail: Mail) -> None:
    action_id = mail.enqueue()
    action = mail.action(action_id)
    assert action.payload == {
        "notice": "member-welcome",
        "event": {"account_id": "a1", "name": "Ada"},
    }
    assert (action.kind, action.subject_account_id, action.workspace_id) == ("EMAIL", "a1", None)
    # MemberNotice keeps the default expiry: an email not sent within a day is not sent at all.
    left = action.expires_at - action.created_at
    assert timedelta(hours=23) < left <= timedelta(days=1)


def test_async_enqueue_prepares_and_refuses_like_the_sync_one(mail: Mail, sink: SmtpSink) -> None:
    add_member(mail.database_url, mail.schema, "b2", None)

    async def enqueue_both() -> int:
        async with await psycopg.AsyncConnection.connect(mail.database_url) as conn:
            with pytest.raises(RecipientCannotReceive, match="NO_ADDRESS"):
                await enqueue_email_async(
                    conn, mail.notice, {"account_id": "b2"}, schema=mail.schema
                )
            action = await enqueue_email_async(
                conn, mail.notice, {"account_id": "a1"}, schema=mail.schema
            )
            await conn.commit()
            return action.id

    action_id = asyncio.run(enqueue_both())
    drain(mail.outbox)
    assert mail.action(action_id).state is ActionState.DONE
    assert len(sink.accepted) == 1


# Faults the relay can throw, and what each must end in. A Retry-class fault is injected once, so
# the action then succeeds on its second attempt with exactly one message accepted.
RETRY_THEN_DONE = [
    ("greeting", "421 4.3.2 service not available", "SMTP_GREETING_421"),
    ("auth", "535", "SMTP_LOGIN_535"),
    ("mail", "451 4.3.0 try again later", "SMTP_MAIL_451"),
    ("rcpt", "452 4.2.2 mailbox full", "SMTP_RCPT_452"),
    ("data", "451 4.3.0 queue full", "SMTP_DATA_451"),
]


@pytest.mark.parametrize(("phase", "fault", "reason"), RETRY_THEN_DONE)
def test_relay_that_provably_holds_nothing_is_retried_until_done(
    mail: Mail, sink: SmtpSink, phase: str, fault: str, reason: str
) -> None:
    sink.inject(phase, fault)
    action_id = mail.enqueue()
    report = drain(mail.outbox)

    assert results(report) == [("Retry", reason), ("Done", None)]
    assert mail.action(action_id).state is ActionState.DONE
    assert len(sink.accepted) == 1


@pytest.mark.parametrize(
    ("phase", "fault", "reason"),
    [
        ("mail", "553 5.7.1 sender not allowed", "SMTP_MAIL_553"),
        ("rcpt", "550 5.1.1 no such user", "SMTP_RCPT_550"),
        ("data", "554 5.7.1 message rejected as spam", "SMTP_DATA_554"),
    ],
)
def test_relay_5xx_refusal_fails_the_email_without_a_retry(
    mail: Mail, sink: SmtpSink, phase: str, fault: str, reason: str
) -> None:
    sink.inject(phase, fault)
    action_id = mail.enqueue()
    report = drain(mail.outbox)

    action = mail.action(action_id)
    assert (action.state, action.stop_reason) == (ActionState.FAILED, reason)
    assert results(report) == [("Failed", reason)]
    assert sink.accepted == []


@pytest.mark.parametrize(
    ("fault", "reason"),
    [("drop", "SMTP_DATA_DISCONNECTED"), ("slow:2.5", "SMTP_DATA_TIMEOUT")],
)
def test_failure_once_data_began_is_uncertain_and_never_sent_again(
    mail: Mail, sink: SmtpSink, fault: str, reason: str
) -> None:
    sink.inject("data", fault)
    action_id = mail.enqueue(max_attempts=5)
    report = drain(mail.outbox)

    action = mail.action(action_id)
    assert (action.state, action.stop_reason) == (ActionState.UNCERTAIN, reason)
    assert results(report) == [("Uncertain", reason)]
    # The relay got the message exactly once and no second attempt ever connected.
    assert len(sink.seen) == 1
    assert sink.connections == 1
    if fault.startswith("slow"):
        # The slow relay had queued it: a retry would have been a duplicate.
        assert len(sink.accepted) == 1


def test_connection_refused_is_retried_then_fails_when_attempts_run_out(
    make_outbox, database_url: str, schema: str
) -> None:
    closed = f"smtp://127.0.0.1:{free_port()}?timeout=1"
    mail = make_mail(make_outbox, database_url, schema, closed)
    action_id = mail.enqueue(max_attempts=3)
    report = drain(mail.outbox)

    assert results(report) == [("Retry", "SMTP_CONNECT_FAILED")] * 3
    action = mail.action(action_id)
    assert (action.state, action.stop_reason) == (ActionState.FAILED, "ATTEMPTS_EXHAUSTED")


def test_retried_email_carries_the_same_message_id_on_every_attempt(
    mail: Mail, sink: SmtpSink
) -> None:
    sink.inject("data", "451 4.3.0 queue full", times=2)
    mail.enqueue()
    report = drain(mail.outbox)

    assert [name for name, _ in results(report)] == ["Retry", "Retry", "Done"]
    seen = sink.seen_ids()
    assert len(seen) == 3 and len(set(seen)) == 1
    assert sink.accepted_ids() == seen[:1]


def test_recipient_who_unsubscribed_between_attempts_gets_nothing_and_is_cancelled(
    mail: Mail, sink: SmtpSink
) -> None:
    sink.inject("mail", "451 4.3.0 try again later")
    action_id = mail.enqueue()
    [first] = run_one_round(mail.outbox)
    assert isinstance(first.result, Retry)

    set_member(mail.database_url, mail.schema, "a1", subscribed=False)
    connections_before = sink.connections
    report = drain(mail.outbox)

    action = mail.action(action_id)
    assert (action.state, action.stop_reason) == (ActionState.CANCELLED, "UNSUBSCRIBED")
    assert results(report) == [("Cancelled", "UNSUBSCRIBED")]
    assert sink.seen == [] and sink.accepted == []
    assert sink.connections == connections_before  # it did not even connect
    assert action.write_started_at is None


@pytest.mark.parametrize(
    ("change", "reason"),
    [({"role": "guest"}, "ROLE_REMOVED"), ({"email": None}, "NO_ADDRESS")],
)
def test_recipient_who_lost_the_role_or_address_before_the_attempt_is_cancelled(
    mail: Mail, sink: SmtpSink, change: dict, reason: str
) -> None:
    action_id = mail.enqueue()
    set_member(mail.database_url, mail.schema, "a1", **change)
    drain(mail.outbox)

    action = mail.action(action_id)
    assert (action.state, action.stop_reason) == (ActionState.CANCELLED, reason)
    assert sink.connections == 0


@pytest.mark.parametrize(
    ("member", "reason"),
    [
        ({"email": RECIPIENT, "subscribed": False}, "UNSUBSCRIBED"),
        ({"email": RECIPIENT, "role": "former"}, "ROLE_REMOVED"),
        ({"email": None}, "NO_ADDRESS"),
    ],
)
def test_enqueue_for_a_recipient_who_cannot_receive_raises_why_and_enqueues_nothing(
    mail: Mail, member: dict, reason: str
) -> None:
    add_member(mail.database_url, mail.schema, "b2", **member)
    with pytest.raises(RecipientCannotReceive) as refused:
        mail.enqueue("b2")
    assert refused.value.reason == reason
    assert refused.value.notice == "member-welcome"
    with psycopg.connect(mail.database_url) as conn:
        count = conn.execute(f'SELECT count(*) FROM "{mail.schema}".agent_action').fetchone()
    assert count == (0,)


def test_same_notice_and_event_enqueued_twice_is_one_email(mail: Mail, sink: SmtpSink) -> None:
    first, second = mail.enqueue(), mail.enqueue()
    assert first == second
    drain(mail.outbox)
    assert len(sink.accepted) == 1


def test_refused_fence_abandons_the_attempt_without_connecting(mail: Mail, sink: SmtpSink) -> None:
    action_id = mail.enqueue()

    async def claim_erase_run():
        async with mail.outbox.store() as store:
            claimed_at = time.monotonic()
            [claimed] = await store.claim({"EMAIL": 1}, mail.outbox.settings.lease)
            # Erased after the claim, before the fence: the fence must refuse the write.
            async with store.connection() as conn:
                await conn.execute(
                    f'DELETE FROM "{mail.schema}".agent_action WHERE id = %s', (action_id,)
                )
            return await mail.outbox.executor(store).run(claimed, claimed_at)

    outcome = asyncio.run(claim_erase_run())
    assert isinstance(outcome.result, Abandoned)
    assert mail.notice.prepared == 2  # it prepared (enqueue and attempt), then stopped
    assert sink.connections == 0


def test_payload_naming_an_unknown_notice_is_given_back_not_sent(
    mail: Mail, sink: SmtpSink
) -> None:
    with psycopg.connect(mail.database_url) as conn:
        action = enqueue(
            conn,
            ActionRequest(EMAIL, "l", "k-unknown", {"notice": "gone", "event": {}}),
            schema=mail.schema,
        )
        conn.commit()
    [outcome] = run_one_round(mail.outbox)
    assert isinstance(outcome.result, Defer)
    after = mail.action(action.id)
    assert (after.state, after.attempt) == (ActionState.ADMITTED, 0)
    assert sink.connections == 0


def test_payload_that_is_not_an_email_fails_without_connecting(mail: Mail, sink: SmtpSink) -> None:
    with psycopg.connect(mail.database_url) as conn:
        action = enqueue(
            conn, ActionRequest(EMAIL, "l", "k-bad", {"to": RECIPIENT}), schema=mail.schema
        )
        conn.commit()
    drain(mail.outbox)
    after = mail.action(action.id)
    assert (after.state, after.stop_reason) == (ActionState.FAILED, "EMAIL_BAD_PAYLOAD")
    assert sink.connections == 0


def test_logs_name_kind_and_message_id_but_never_credentials_or_recipient(
    mail: Mail, sink: SmtpSink, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    sink.inject("rcpt", "550 5.1.1 <ada.lovelace@people.example.org>: no such user")
    sink.inject("greeting", "421 4.3.2 busy")
    mail.enqueue("a1")
    add_member(mail.database_url, mail.schema, "a2", "grace.hopper@people.example.org")
    mail.enqueue("a2")
    report = drain(mail.outbox)
    assert {type(o.result) for o in report.outcomes} >= {Done, Failed, Retry}

    # aiosmtpd's own logger ("mail.log") belongs to the test relay, not to the sender.
    ours = [r for r in caplog.records if not r.name.startswith("mail.log")]
    formatter = logging.Formatter("%(name)s %(message)s")
    # The formatted line and every field of the record (structured logs ship the extras too).
    text = "\n".join(formatter.format(r) + repr(vars(r)) for r in ours)
    assert "message_id=<" in text
    for secret in (PASSWORD, USER, "ada.lovelace", "grace.hopper", "people.example.org"):
        assert secret not in text
