"""Whether the services a test needs are there: skip on a machine that lacks one, fail in CI.

A missing service skips the tests that need it with a reason naming the service and its URL, so
a laptop without RabbitMQ still runs the rest. In CI (``CI=true``) the same absence fails those
tests: a green run that tested nothing is worse than a red one.
"""

from __future__ import annotations

import os
import socket
from typing import NoReturn
from urllib.parse import urlparse

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() == "true"


def missing_service(message: str) -> NoReturn:
    """Skips the calling test (fails it in CI) because ``message``'s service is missing."""
    if in_ci():
        pytest.fail(f"{message} (CI=true: a missing service fails the run)", pytrace=False)
    pytest.skip(message)


def reachable(url: str, default_port: int) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection(
            (parsed.hostname or "127.0.0.1", parsed.port or default_port), 2
        ):
            return True
    except OSError:
        return False


def shown(url: str) -> str:
    """The URL without its password, for a skip or failure message."""
    parsed = urlparse(url)
    if parsed.password is None:
        return url
    return parsed._replace(netloc=parsed.netloc.replace(f":{parsed.password}@", ":***@")).geturl()


def require_reachable(service: str, url: str, default_port: int) -> str:
    """``url`` when its server accepts a connection; else skips (fails in CI) naming it."""
    if not reachable(url, default_port):
        missing_service(f"{service} not reachable at {shown(url)}")
    return url
