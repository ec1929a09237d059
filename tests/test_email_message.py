"""SMTP URL parsing, PreparedEmail checks and the headers of every message (no services needed)."""

from __future__ import annotations

import pytest

from outbox.email import PreparedEmail, SmtpSettings, build_message, message_id_for
from outbox.errors import ConfigurationError

SENDER = "Acme <noreply@acme.example>"


@pytest.mark.parametrize(
    ("url", "host", "port", "implicit_tls", "starttls"),
    [
        ("smtp://relay.example", "relay.example", 25, False, False),
        ("smtp://relay.example?starttls=true", "relay.example", 587, False, True),
        ("smtp://relay.example:2525?starttls", "relay.example", 2525, False, True),
        ("smtps://relay.example", "relay.example", 465, True, False),
        ("SMTPS://relay.example:1465", "relay.example", 1465, True, False),
    ],
)
def test_smtp_url_gives_host_port_and_tls_mode(
    url: str, host: str, port: int, implicit_tls: bool, starttls: bool
) -> None:
    settings = SmtpSettings.from_url(url, SENDER)
    assert (settings.host, settings.port) == (host, port)
    assert (settings.implicit_tls, settings.starttls) == (implicit_tls, starttls)
    assert settings.username is None and settings.password is None


def test_smtp_url_credentials_are_percent_decoded_and_never_shown() -> None:
    settings = SmtpSettings.from_url(
        "smtp://apikey%40acme:p%40ss%3Aw%2Frd@relay.example:587?starttls=true&timeout=7.5",
        SENDER,
    )
    assert (settings.username, settings.password) == ("apikey@acme", "p@ss:w/rd")
    assert settings.timeout == 7.5
    for shown in (repr(settings), str(settings)):
        assert "p@ss" not in shown and "w%2Frd" not in shown and "p%40ss" not in shown
        assert "apikey" not in shown
    assert str(settings) == "smtp://***@relay.example:587?starttls=true"


@pytest.mark.parametrize(
    ("url", "sender", "complaint"),
    [
        ("http://relay.example", SENDER, "scheme"),
        ("smtp://", SENDER, "no host"),
        ("smtp://relay.example:port", SENDER, "port"),
        ("smtps://relay.example?starttls=true", SENDER, "already uses TLS"),
        ("smtp://relay.example?starttls=maybe", SENDER, "starttls"),
        ("smtp://relay.example?timeout=0", SENDER, "timeout"),
        ("smtp://relay.example?tls=1", SENDER, "unknown parameter"),
        ("smtp://relay.example", "not an address", "sender"),
    ],
)
def test_malformed_smtp_settings_are_refused_naming_the_problem(
    url: str, sender: str, complaint: str
) -> None:
    with pytest.raises(ConfigurationError, match=complaint):
        SmtpSettings.from_url(url, sender)


def test_smtp_settings_come_from_the_outbox_environment() -> None:
    env = {"OUTBOX_SMTP_URL": "smtps://u:pw@relay.example", "OUTBOX_SMTP_SENDER": SENDER}
    settings = SmtpSettings.from_env(env)
    assert (settings.host, settings.port, settings.password) == ("relay.example", 465, "pw")
    with pytest.raises(ConfigurationError, match="OUTBOX_SMTP_URL"):
        SmtpSettings.from_env({})


def prepared(**overrides) -> PreparedEmail:
    values = {"to": "bob@people.example", "subject": "Hi", "text": "Hello\n"}
    values.update(overrides)
    return PreparedEmail(**values)


def test_message_id_is_stable_per_idempotency_key_and_under_the_sender_domain() -> None:
    sender = SmtpSettings.from_url("smtp://relay.example", SENDER).sender_address()
    first = build_message(prepared(), sender, "invite:42")
    again = build_message(prepared(subject="Other"), sender, "invite:42")
    other = build_message(prepared(), sender, "invite:43")
    assert first["Message-ID"] == again["Message-ID"] == message_id_for("invite:42", sender)
    assert first["Message-ID"] != other["Message-ID"]
    assert first["Message-ID"].endswith("@acme.example>")
    assert "invite" not in first["Message-ID"]  # the key itself does not leak


def test_every_message_suppresses_auto_replies_and_unsubscribe_headers_need_a_url() -> None:
    sender = SmtpSettings.from_url("smtp://relay.example", SENDER).sender_address()
    plain = build_message(prepared(), sender, "k")
    assert plain["Auto-Submitted"] == "auto-generated"
    assert plain["X-Auto-Response-Suppress"] == "All"
    assert plain["List-Unsubscribe"] is None and plain["List-Unsubscribe-Post"] is None
    assert plain.get_content_type() == "text/plain"

    full = build_message(
        prepared(html="<p>Hello</p>", unsubscribe_url="https://acme.example/u/1"), sender, "k"
    )
    assert full["List-Unsubscribe"] == "<https://acme.example/u/1>"
    assert full["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert full.get_content_type() == "multipart/alternative"
    assert full["From"] == SENDER


@pytest.mark.parametrize(
    "overrides",
    [
        {"to": "not-an-address"},
        {"to": "bob@people.example\r\nBcc: eve@evil.example"},
        {"subject": "Hi\nBcc: eve@evil.example"},
        {"subject": "   "},
        {"unsubscribe_url": "http://acme.example/u/1"},
        {"to_name": "Bob\r\nX-Evil: 1"},
    ],
)
def test_prepared_email_refuses_malformed_addresses_and_header_injection(overrides) -> None:
    with pytest.raises(ValueError):
        prepared(**overrides)
