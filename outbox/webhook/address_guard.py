"""The guard against server-side request forgery: a webhook goes only to a public address.

A subscriber chooses the endpoint URL, so without a guard anyone who may add a subscription can
make the outbox's workers send requests to the internal network (a metadata service at
169.254.169.254, an admin port on 127.0.0.1). Before every delivery the host is resolved, and
the request is refused unless every address it resolves to is global (not private, loopback,
link-local, multicast, reserved, unspecified or shared; an IPv4-mapped IPv6 address counts as
the IPv4 address it maps). The request then goes to the address that was checked, never to a
second resolution of the name, so a DNS answer that changes between the check and the connect
(DNS rebinding) cannot slip past. Only http and https are spoken; redirects are never followed.

``OUTBOX_WEBHOOK_ALLOW_PRIVATE`` widens the guard: ``true`` allows every address, or a
comma-separated list of networks (``10.1.0.0/16,::1/128``) allows those.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import SplitResult, urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network

SCHEMES = ("http", "https")


class AddressRefused(Exception):
    """The endpoint is not one the outbox may call. ``reason`` is an UPPER_SNAKE_CASE code."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason


def _unmapped(address: IPAddress) -> IPAddress:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def is_public(address: IPAddress) -> bool:
    """Whether a webhook may go to ``address`` with no allowance: a global unicast address.
    (Python counts some multicast ranges as global; a webhook is never multicast.)"""
    plain = _unmapped(address)
    return plain.is_global and not plain.is_multicast


@dataclass(frozen=True, slots=True)
class AddressPolicy:
    """Which addresses a webhook may go to: public ones, and those the allowance names."""

    allow_all: bool = False
    allowed: tuple[IPNetwork, ...] = ()

    def permits(self, address: IPAddress) -> bool:
        if self.allow_all or is_public(address):
            return True
        plain = _unmapped(address)
        return any(plain in network or address in network for network in self.allowed)

    @classmethod
    def parse(cls, raw: str | None) -> AddressPolicy:
        """From ``OUTBOX_WEBHOOK_ALLOW_PRIVATE``: empty/false = none, true = all, else networks.
        Raises ValueError naming the entry that is not a network."""
        text = (raw or "").strip()
        if text.lower() in ("", "0", "false", "no", "off"):
            return cls()
        if text.lower() in ("1", "true", "yes", "on", "all"):
            return cls(allow_all=True)
        networks = []
        for entry in (part.strip() for part in text.split(",")):
            if not entry:
                continue
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
            except ValueError:
                raise ValueError(f"{entry!r} is not a network (10.0.0.0/8, ::1/128)") from None
        return cls(allowed=tuple(networks))


def check_endpoint_url(url: str) -> SplitResult:
    """The URL split, if it can be a webhook endpoint at all: http(s), a host, no credentials.
    Raises ``AddressRefused``."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parsing the port is the check
    except ValueError:
        raise AddressRefused("WEBHOOK_URL_INVALID", "the URL cannot be parsed") from None
    if parts.scheme.lower() not in SCHEMES:
        raise AddressRefused(
            "WEBHOOK_SCHEME_REFUSED", f"scheme must be http or https, not {parts.scheme or 'none'}"
        )
    if not parts.hostname:
        raise AddressRefused("WEBHOOK_URL_INVALID", "the URL has no host")
    if parts.username is not None or parts.password is not None:
        raise AddressRefused("WEBHOOK_URL_INVALID", "the URL must not carry credentials")
    return parts


@dataclass(frozen=True, slots=True)
class Target:
    """Where one delivery goes: the URL with the checked address in place of the host name,
    and what the request must say to reach that host by name (Host header, TLS server name)."""

    url: str
    host_header: str
    server_name: str | None  # the name TLS must verify (https only)
    address: IPAddress


def _literal(host: str) -> IPAddress | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


async def _resolve(host: str, port: int) -> list[IPAddress]:
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    # Drop an IPv6 zone ("fe80::1%eth0"): the address itself is what the guard judges.
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in infos]


def choose(addresses: Iterable[IPAddress], policy: AddressPolicy) -> IPAddress:
    """The first address, if the policy permits every one (a name that resolves to one public
    and one private address is refused: which one a connect would take is not ours to pick)."""
    found = list(dict.fromkeys(addresses))
    if not found:
        raise AddressRefused("WEBHOOK_DNS_FAILED", "the host resolves to no address")
    for address in found:
        if not policy.permits(address):
            raise AddressRefused(
                "WEBHOOK_ADDRESS_REFUSED", "the host resolves to a non-public address"
            )
    return found[0]


async def resolve_target(url: str, policy: AddressPolicy) -> Target:
    """Checks ``url`` and its host's addresses; raises ``AddressRefused`` (reason
    ``WEBHOOK_DNS_FAILED`` when the name does not resolve: that may pass)."""
    parts = check_endpoint_url(url)
    host = parts.hostname or ""
    scheme = parts.scheme.lower()
    port = parts.port or (443 if scheme == "https" else 80)
    literal = _literal(host)
    if literal is not None:
        address = choose([literal], policy)
    else:
        try:
            address = choose(await _resolve(host, port), policy)
        except (OSError, UnicodeError):
            raise AddressRefused("WEBHOOK_DNS_FAILED", "the host name does not resolve") from None
    shown = f"[{address}]" if address.version == 6 else str(address)
    netloc = f"{shown}:{parts.port}" if parts.port else shown
    pinned = parts._replace(scheme=scheme, netloc=netloc, fragment="").geturl()
    host_header = parts.netloc.rsplit("@", 1)[-1]
    return Target(
        url=pinned,
        host_header=host_header,
        server_name=host if scheme == "https" and literal is None else None,
        address=address,
    )
