"""Email bad input is refused at enqueue, and what only shows at attempt time fails at once.

Whatever ``enqueue_email`` accepts, the message builder builds into exactly the headers the notice
meant (one recipient, one subject line, one unsubscribe target); whatever the email package
cannot build, ``enqueue_email`` refuses with a ``ValueError`` and enqueues nothing. A message that
becomes unbuildable after enqueue ends FAILED ``MESSAGE_INVALID`` on its first attempt without
touching the relay, and ``readback_ref`` keeps the Message-ID and the relay's queue id, never the
relay's reply text. Against the real aiosmtpd relay and PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from email import message_from_bytes, policy
from email.headerregistry import Address
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from outbox import EMAIL, ActionState, Outbox, StopReason
from outbox.email import (
    EmailAdapter,
    EmailNotice,
    PreparedEmail,
    SmtpSettings,
    enqueue_email,
)
from outbox.email.adapter import queue_id, readback_ref
from outbox.email.message import build_message, message_bytes, needs_smtputf8, render
from outbox.email.notice import MAX_UNSUBSCRIBE_URL_LENGTH, InvalidEmail
from outbox.errors import ConfigurationError, InvalidActionRequest
from outbox.testing import drain
from tests.email_sink import SmtpSink
from tests.email_support import RECIPIENT, SENDER, Mail, make_mail, set_member
from tests.support import rows

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


class FieldsNotice(EmailNotice):
    """Renders whatever fields the test put under the event's ``case`` (kept in Python, so that
    the payload stays plain JSON and only the message builder judges the fields)."""

    name = "fields"

    def __init__(self) -> None:
        self.cases: dict[str, dict[str, Any]] = {}

    def prepare(self, event: Mapping[str, Any]) -> PreparedEmail:
        return PreparedEmail(**self.cases[event["case"]])


GOOD = {"to": "bob@people.example", "subject": "Hello", "text": "Hi.\n"}


@pytest.fixture
def fields_outbox(make_outbox) -> Outbox:
    ob = make_outbox()
    ob.migrate()
    return ob


def enqueue_case(conn, schema: str, notice: FieldsNotice, case: str, **fields: Any):
    notice.cases[case] = {**GOOD, **fields}
    return enqueue_email(conn, notice, {"case": case}, schema=schema)


# -- refused at enqueue -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "fields",
    [
        {"subject": "Hello\x0bthere"},
        {"subject": "Hello\x0cthere"},
        {"subject": "Hello\u2028there"},
        {"subject": "Hello\x85there"},
        {"subject": "Hello\x00there"},
        {"subject": "Hello\ud800"},
        {"text": "body \udfff"},
        {"to_name": "Bob\u2029Bcc: eve@evil.example"},
        {"to": "<a@b>"},
        {"to": "@x.com"},
        {"to": "a@x@y"},
        {"unsubscribe_url": "https://acme.example/u/1>, <https://evil.example/x"},
        {"unsubscribe_url": "https://acme.example/u/1,https://evil.example/x"},
        {"unsubscribe_url": "https://acme.example/u/a b"},
        {"unsubscribe_url": "https://acme.example/u/ä"},
        {"unsubscribe_url": "https://acme.example/" + "u" * MAX_UNSUBSCRIBE_URL_LENGTH},
    ],
)
def test_what_the_message_builder_would_refuse_is_refused_at_enqueue_as_value_error(
    fields_outbox, conn, schema, fields
) -> None:
    notice = FieldsNotice()
    with pytest.raises(ValueError) as raised:
        enqueue_case(conn, schema, notice, "bad", **fields)
    assert isinstance(raised.value, InvalidEmail)
    # Nothing was written and the transaction goes on.
    enqueue_case(conn, schema, notice, "good")
    conn.commit()
    assert [r["payload"] for r in rows(conn, schema)] == [
        {"notice": "fields", "event": {"case": "good"}}
    ]


@pytest.mark.parametrize("event", [{"x": float("nan")}, {"x": "\ud800"}, {"x": "a\x00b"}])
def test_an_event_the_payload_cannot_hold_is_refused_by_field(fields_outbox, conn, schema, event):
    notice = FieldsNotice()
    notice.cases["c"] = GOOD
    with pytest.raises(InvalidActionRequest) as raised:
        enqueue_email(conn, notice, {"case": "c", **event}, schema=schema)
    assert raised.value.field == "payload"
    assert conn.execute("SELECT 1").fetchone() == (1,)
    assert rows(conn, schema) == []


def test_a_sender_with_a_line_break_or_unreadable_part_is_refused_not_cut_down() -> None:
    for sender in ("noreply@mail.example.com\r\nBcc: eve@evil.example", "a@b.example junk"):
        with pytest.raises(ConfigurationError):
            SmtpSettings.from_url("smtp://relay.example", sender)
    assert str(SmtpSettings.from_url("smtp://r", SENDER).sender_address()) == SENDER


# -- the property: enqueue accepts exactly what builds intact -----------------------------------

SPECIAL = ["\x00", "\ud800", "\x0b", "\x0c", "\x1c", "\x7f", "\x85", "\u2028", "\u2029"]
SPECIAL += ["\r", "\n", "\t", " ", "<", ">", ",", '"', "@", "é", "😀", "=?", "?="]
printable = st.characters(min_codepoint=0x20, max_codepoint=0x7E)
# Mostly printable, so that about half the examples build; any code point and the specials
# otherwise.
chars = st.one_of(
    printable,
    printable,
    printable,
    printable,
    st.sampled_from(SPECIAL),
    st.characters(codec=None, exclude_categories=()),
)
words = st.lists(chars, max_size=8).map("".join)
plain = st.text(st.characters(min_codepoint=0x61, max_codepoint=0x7A), min_size=1, max_size=8)
addresses = st.one_of(
    st.builds(lambda a, b: f"{a}@{b}.example", plain, plain),
    st.builds(lambda a, b: f"{a}@{b}.example", plain, plain),
    st.builds(lambda a, w, b: f"{a}{w}@{b}.example", plain, words, plain),
    words,
)
urls = st.one_of(
    st.none(),
    st.builds(lambda w: f"https://acme.example/u/{w}", words),
    st.builds(lambda n: "https://acme.example/" + "u" * n, st.sampled_from([60, 200, 880, 900])),
)
email_fields = st.fixed_dictionaries(
    {
        "to": addresses,
        "subject": st.one_of(
            st.text(printable, min_size=1, max_size=200),
            words,
            st.builds(lambda w: "Hello " + w, words),
            st.builds(lambda w: w * 30, words),
        ),
        "text": words,
    },
    optional={"html": words, "to_name": words, "unsubscribe_url": urls},
)


def raw_headers(message: Any, name: str) -> list[str]:
    """A header's values as they were on the wire, unfolded, not decoded."""
    return [
        "".join(value.splitlines()).strip()
        for key, value in message.raw_items()
        if key.lower() == name.lower()
    ]


def unchecked(fields: dict[str, Any]) -> PreparedEmail:
    """A ``PreparedEmail`` built without its own checks: what the email package alone says."""
    prepared = object.__new__(PreparedEmail)
    for name in ("to", "subject", "text", "html", "to_name", "unsubscribe_url"):
        object.__setattr__(prepared, name, fields.get(name))
    return prepared


def package_refuses(fields: dict[str, Any], sender: Address) -> bool:
    try:
        prepared = unchecked(fields)
        address = Address(display_name=prepared.to_name or "", addr_spec=prepared.to)
        if not address.username or not address.domain:
            return True
        message = build_message(prepared, sender, "k")
        message_bytes(message, needs_smtputf8(sender, prepared.to))
    except Exception:
        return True
    return False


@settings(
    max_examples=500,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(fields=email_fields)
def test_enqueue_accepts_exactly_what_builds_into_the_headers_the_notice_meant(
    fields_outbox, conn, schema, fields
) -> None:
    conn.rollback()
    notice = FieldsNotice()
    sender = SmtpSettings.from_url("smtp://relay.example", SENDER).sender_address()
    try:
        enqueue_case(conn, schema, notice, "c", **fields)
        accepted = True
    except InvalidEmail as refusal:
        accepted = False
        event(f"refused: {str(refusal).split(' ', 1)[0]}")
    event("accepted" if accepted else "refused")
    assert conn.execute("SELECT 1").fetchone() == (1,)
    if not accepted:
        assert rows(conn, schema) == []
        return
    # What the email package alone cannot build, enqueue refused.
    assert not package_refuses(fields, sender), fields
    # And what it accepted is built, by an attempt's own code, into what the notice meant.
    prepared = PreparedEmail(**{**GOOD, **fields})
    rendered = render(prepared, sender, "k")
    parsed = message_from_bytes(rendered.data, policy=policy.default)
    assert [a.addr_spec for a in parsed["To"].addresses] == [prepared.to]
    assert len(parsed.get_all("Subject")) == 1
    # A header keeps no whitespace at its ends (RFC 5322 unfolding); all else arrives as is.
    assert str(parsed["Subject"]).strip() == prepared.subject.strip()
    if prepared.unsubscribe_url:
        assert raw_headers(parsed, "List-Unsubscribe") == [f"<{prepared.unsubscribe_url}>"]
    conn.rollback()


# -- attempt time -------------------------------------------------------------------------------


def test_a_message_that_no_longer_builds_fails_at_once_without_touching_the_relay(
    mail: Mail, sink: SmtpSink
) -> None:
    action_id = mail.enqueue()
    # After enqueue, the member's address became one no message can be sent to.
    set_member(mail.database_url, mail.schema, "a1", email="<a1@people.example>")
    report = drain(mail.outbox)
    action = mail.action(action_id)
    assert (action.state, action.stop_reason, action.attempt) == (
        ActionState.FAILED,
        StopReason.MESSAGE_INVALID,
        1,
    )
    assert [type(o.result).__name__ for o in report.outcomes] == ["Failed"]
    assert sink.seen == []


def test_a_long_unsubscribe_url_reaches_the_relay_whole(make_outbox, database_url, schema, sink):
    url = "https://app.example.com/unsubscribe?token=" + "t0K3n" * 160  # 842 characters
    notice = FieldsNotice()
    outbox = make_outbox()
    outbox.register(EMAIL, EmailAdapter(SmtpSettings.from_url(sink.url, SENDER), [notice]))
    outbox.migrate()
    with psycopg.connect(database_url) as conn:
        enqueue_case(conn, schema, notice, "long", to=RECIPIENT, unsubscribe_url=url)
        conn.commit()
    drain(outbox)
    [received] = sink.accepted
    # As written on the wire: a URL folded or RFC 2047-encoded is not a URL to a mail client.
    assert raw_headers(received.message, "List-Unsubscribe") == [f"<{url}>"]


def test_readback_ref_is_the_message_id_and_queue_id_never_the_relays_text(
    mail: Mail, sink: SmtpSink
) -> None:
    sink.inject("data", f"250 2.0.0 Ok: <{RECIPIENT}> queued as 4F1X2Y3Z")
    action_id = mail.enqueue()
    drain(mail.outbox)
    action = mail.action(action_id)
    [received] = sink.seen
    assert action.state is ActionState.DONE
    assert action.readback_ref == f"{received.message['Message-ID']} queue-id=4F1X2Y3Z"
    assert RECIPIENT not in action.readback_ref and "ada" not in action.readback_ref


@pytest.mark.parametrize(
    ("reply", "queued"),
    [
        ("2.0.0 Ok: queued as 4F1X2Y3Z", "4F1X2Y3Z"),
        ("OK id=1abcDE-000123-AB", "1abcDE-000123-AB"),
        ("2.0.0 OK queued as 1", "1"),
        ("2.0.0 Ok: queued as ada.lovelace@people.example.org", None),
        ("2.0.0 <ada@people.example.org> accepted", None),
        ("2.0.0 OK id=<ada@people.example.org>", None),
        ("Message accepted for delivery", None),
        ("2.0.0 OK queued as", None),
    ],
)
def test_queue_id_is_taken_only_where_it_cannot_be_part_of_an_address(reply, queued) -> None:
    assert queue_id(reply) == queued
    ref = readback_ref("<abc.outbox@mail.example.com>", reply)
    assert ref.count("@") == 1  # the Message-ID's own


def test_done_result_carries_only_the_message_id_when_the_relay_names_no_queue(
    mail: Mail, sink: SmtpSink
) -> None:
    sink.inject("data", f"250 Message for {RECIPIENT} accepted")
    action_id = mail.enqueue()
    drain(mail.outbox)
    action = mail.action(action_id)
    assert action.state is ActionState.DONE
    assert action.readback_ref == sink.seen[0].message["Message-ID"]


def test_a_long_non_ascii_subject_reaches_the_relay_unchanged(
    make_outbox, database_url, schema, sink
) -> None:
    subject = "Rückmeldung 0000é " * 12 + "Ende"  # folds into several encoded words
    notice = FieldsNotice()
    outbox = make_outbox()
    outbox.register(EMAIL, EmailAdapter(SmtpSettings.from_url(sink.url, SENDER), [notice]))
    outbox.migrate()
    with psycopg.connect(database_url) as conn:
        enqueue_case(conn, schema, notice, "subject", to=RECIPIENT, subject=subject)
        conn.commit()
    drain(outbox)
    [received] = sink.accepted
    assert received.message["Subject"] == subject
