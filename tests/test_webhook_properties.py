"""The rules of the SSRF guard and of signing, over every input hypothesis finds."""

from __future__ import annotations

import asyncio
import base64
import ipaddress
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from outbox.webhook import AddressPolicy, AddressRefused, is_public, sign_headers
from outbox.webhook.address_guard import resolve_target

addresses = st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6))
secrets = st.binary(min_size=24, max_size=64).map(lambda b: "whsec_" + base64.b64encode(b).decode())
bodies = st.text(max_size=500)
ids = st.from_regex(r"msg_[A-Za-z0-9_-]{1,40}", fullmatch=True)


def _plain(address):
    mapped = getattr(address, "ipv4_mapped", None)
    return mapped or address


def _refused(url: str, policy: AddressPolicy) -> bool:
    try:
        asyncio.run(resolve_target(url, policy))
    except AddressRefused:
        return True
    return False


def _url(address) -> str:
    host = f"[{address}]" if address.version == 6 else str(address)
    return f"https://{host}/hook"


@settings(max_examples=300, deadline=None)
@given(addresses)
def test_an_address_is_refused_exactly_when_it_is_not_global(address) -> None:
    plain = _plain(address)
    expected_refused = not plain.is_global or plain.is_multicast
    assert is_public(address) is not expected_refused
    assert _refused(_url(address), AddressPolicy()) is expected_refused
    # An IPv4-mapped IPv6 address is judged as the IPv4 address it maps.
    if address.version == 4:
        mapped = ipaddress.IPv6Address(f"::ffff:{address}")
        assert _refused(_url(mapped), AddressPolicy()) is expected_refused


@settings(max_examples=200, deadline=None)
@given(addresses)
def test_an_allowance_lets_through_what_it_names_and_nothing_else(address) -> None:
    assert not _refused(_url(address), AddressPolicy(allow_all=True))
    network = ipaddress.ip_network(f"{_plain(address)}/{_plain(address).max_prefixlen}")
    assert not _refused(_url(address), AddressPolicy(allowed=(network,)))


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://10.0.0.5/",
        "http://169.254.169.254/latest/meta-data",
        "http://[::1]/",
        "http://[::ffff:10.0.0.1]/",
        "http://[fe80::1]/",
        "http://0.0.0.0/",
        "http://224.0.0.1/",
        "http://localhost/",
        "ftp://93.184.215.14/",
        "file:///etc/passwd",
        "http://user:pw@93.184.215.14/",
    ],
)
def test_known_internal_targets_and_other_schemes_are_refused(url: str) -> None:
    assert _refused(url, AddressPolicy())


@settings(max_examples=200, deadline=None)
@given(secrets, bodies, ids)
def test_the_reference_verifier_accepts_every_signed_delivery(secret, body, msg_id) -> None:
    headers = sign_headers(msg_id, body, [secret])
    assert Webhook(secret).verify(body, headers, json_parse=False) is None


@settings(max_examples=200, deadline=None)
@given(secrets, secrets, bodies, ids)
def test_with_two_secrets_a_receiver_on_either_verifies(old, new, body, msg_id) -> None:
    headers = sign_headers(msg_id, body, [new, old])
    for secret in (old, new):
        Webhook(secret).verify(body, headers, json_parse=False)


@settings(max_examples=200, deadline=None)
@given(secrets, bodies, bodies, ids, st.integers(min_value=1, max_value=240))
def test_a_tampered_body_or_timestamp_is_refused(secret, body, other, msg_id, shift) -> None:
    headers = sign_headers(msg_id, body, [secret])
    if other != body:
        with pytest.raises(WebhookVerificationError):
            Webhook(secret).verify(other, headers, json_parse=False)
    moved = dict(headers, **{"webhook-timestamp": str(int(headers["webhook-timestamp"]) + shift)})
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(body, moved, json_parse=False)


def test_a_stale_signature_is_refused_by_the_reference_verifier() -> None:
    secret = "whsec_" + base64.b64encode(b"k" * 32).decode()
    headers = sign_headers("msg_1", "{}", [secret], at=datetime.now(UTC) - timedelta(hours=1))
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify("{}", headers, json_parse=False)
