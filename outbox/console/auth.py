"""Who may use the console, and where it may listen.

Logins come from ``OUTBOX_CONSOLE_USERS`` (``name:password`` pairs, a password in clear or as a
werkzeug hash). Without any login the console may listen on loopback only: anyone who reaches a
wider address could otherwise act on the outbox.
"""

from __future__ import annotations

import hmac
import ipaddress
import socket

from werkzeug.security import check_password_hash

from outbox.errors import ConfigurationError

#: werkzeug's hash methods: a password starting with one of these is a hash, not the password.
_HASH_PREFIXES = ("scrypt:", "pbkdf2:")


def parse_users(spec: str | None) -> dict[str, str]:
    """``"alice:secret,bob:scrypt:..."`` -> ``{"alice": "secret", "bob": "scrypt:..."}``."""
    users: dict[str, str] = {}
    for entry in (spec or "").split(","):
        entry = entry.strip()
        if not entry:
            continue
        name, sep, password = entry.partition(":")
        name = name.strip()
        if not sep or not name or not password:
            raise ConfigurationError(
                "OUTBOX_CONSOLE_USERS: each entry is name:password (comma-separated); "
                f"entry {len(users) + 1} is not"
            )
        users[name] = password
    return users


def check_login(users: dict[str, str], name: str, password: str) -> bool:
    """Whether ``password`` is ``name``'s. Takes about as long for an unknown name."""
    stored = users.get(name)
    if stored is None:
        hmac.compare_digest(password.encode(), b"\0" * 16)
        return False
    if stored.startswith(_HASH_PREFIXES):
        return check_password_hash(stored, password)
    return hmac.compare_digest(stored.encode(), password.encode())


def is_loopback(host: str) -> bool:
    """Whether every address ``host`` names is a loopback one (``127.0.0.1``, ``::1``,
    ``localhost``). ``0.0.0.0``, ``::`` and any other interface are not."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        pass
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


def check_bind(host: str, users: dict[str, str]) -> None:
    """Refuse to listen beyond loopback without a login (one line, a configuration error)."""
    if not users and not is_loopback(host):
        raise ConfigurationError(
            f"refusing to listen on {host} without a login: set OUTBOX_CONSOLE_USERS "
            "(name:password) or listen on 127.0.0.1"
        )
