"""TLS to the relay: STARTTLS and smtps:// with a real certificate, and no credential or message
ever sent in clear when TLS was asked for and cannot be had."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from outbox import ActionState
from outbox.testing import drain
from tests.email_sink import SmtpSink
from tests.email_support import make_mail

USER, PASSWORD = "tls-user", "tls-Pa55word"


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 (EC, so it is made in milliseconds)."""
    if shutil.which("openssl") is None:  # pragma: no cover - present wherever CI runs
        pytest.skip("openssl is needed to make a test certificate")
    folder = tmp_path_factory.mktemp("tls")
    cert, key = folder / "cert.pem", folder / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
         "-nodes", "-keyout", str(key), "-out", str(cert), "-days", "1",
         "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


@pytest.fixture
def server_tls(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(*map(str, certificate))
    return context


@pytest.fixture
def client_tls(certificate: tuple[Path, Path]) -> ssl.SSLContext:
    """Trusts the test certificate and verifies it, as production does with the system CAs."""
    return ssl.create_default_context(cafile=str(certificate[0]))


@pytest.fixture
def sinks() -> Iterator[list[SmtpSink]]:
    started: list[SmtpSink] = []
    yield started
    for sink in started:
        sink.stop()


def start(sinks: list[SmtpSink], *args, **kwargs) -> SmtpSink:
    sink = SmtpSink(*args, **kwargs).start()
    sinks.append(sink)
    return sink


def test_starttls_relay_gets_login_and_message_only_inside_tls(
    make_outbox, database_url, schema, sinks, server_tls, client_tls
) -> None:
    sink = start(sinks, USER, PASSWORD, starttls=server_tls)
    mail = make_mail(make_outbox, database_url, schema, sink.url, tls_context=client_tls)
    action_id = mail.enqueue()
    drain(mail.outbox)

    assert mail.action(action_id).state is ActionState.DONE
    [received] = sink.accepted
    assert received.tls
    assert sink.auth_attempts >= 1  # the relay requires AUTH, and only offers it after STARTTLS


def test_smtps_relay_gets_the_message_over_tls_from_the_first_byte(
    make_outbox, database_url, schema, sinks, server_tls, client_tls
) -> None:
    sink = start(sinks, implicit_tls=server_tls)
    assert sink.url.startswith("smtps://")
    mail = make_mail(make_outbox, database_url, schema, sink.url, tls_context=client_tls)
    action_id = mail.enqueue()
    drain(mail.outbox)

    assert mail.action(action_id).state is ActionState.DONE
    [received] = sink.accepted
    assert received.tls


@pytest.mark.filterwarnings("ignore:Requiring AUTH:UserWarning")
def test_starttls_demanded_from_a_relay_without_it_sends_nothing_in_clear(
    make_outbox, database_url, schema, sinks
) -> None:
    sink = start(sinks, USER, PASSWORD)  # plain relay, offers AUTH without TLS
    url = f"smtp://{USER}:{PASSWORD}@127.0.0.1:{sink.port}?starttls=true&timeout=2"
    mail = make_mail(make_outbox, database_url, schema, url)
    action_id = mail.enqueue(max_attempts=2)
    report = drain(mail.outbox)

    reasons = [o.result.reason for o in report.outcomes]
    assert reasons == ["SMTP_STARTTLS_ERROR"] * 2
    action = mail.action(action_id)
    assert (action.state, action.stop_reason) == (ActionState.FAILED, "ATTEMPTS_EXHAUSTED")
    assert sink.auth_attempts == 0 and sink.seen == []


def test_untrusted_relay_certificate_is_retried_and_gets_nothing(
    make_outbox, database_url, schema, sinks, server_tls
) -> None:
    sink = start(sinks, USER, PASSWORD, starttls=server_tls)
    # The system's trust store does not know the test certificate.
    mail = make_mail(make_outbox, database_url, schema, f"{sink.url}&timeout=2")
    action_id = mail.enqueue(max_attempts=1)
    report = drain(mail.outbox)

    assert [o.result.reason for o in report.outcomes] == ["SMTP_STARTTLS_ERROR"]
    assert mail.action(action_id).state is ActionState.FAILED
    assert sink.auth_attempts == 0 and sink.seen == []
