"""Shared fixtures: the real PostgreSQL (and brokers) from the environment, a fresh schema a test.

URLs come from OUTBOX_TEST_DATABASE_URL / OUTBOX_TEST_REDIS_URL / OUTBOX_TEST_RABBITMQ_URL and
default to the local services. Where none answers and Docker runs, testcontainers starts one.
"""

from __future__ import annotations

import itertools
import os
import socket
from collections.abc import Iterator
from urllib.parse import urlparse

import psycopg
import pytest

from outbox import Outbox

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

_schemas = itertools.count()


def _reachable(url: str) -> bool:
    parsed = urlparse(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 5432), 2):
            return True
    except OSError:
        return False


def _docker_available() -> bool:
    try:
        import docker  # type: ignore[import-not-found]

        docker.from_env().ping()
        return True
    except Exception:
        return False


@pytest.fixture(scope="session")
def database_url() -> Iterator[str]:
    url = os.environ.get("OUTBOX_TEST_DATABASE_URL", DEFAULT_DATABASE_URL)
    if _reachable(url) or not _docker_available():
        yield url
        return
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]

    with PostgresContainer("postgres:15", driver=None) as container:
        yield container.get_connection_url()


@pytest.fixture(scope="session")
def redis_url() -> str:
    return os.environ.get("OUTBOX_TEST_REDIS_URL", DEFAULT_REDIS_URL)


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    return os.environ.get("OUTBOX_TEST_RABBITMQ_URL", DEFAULT_RABBITMQ_URL)


@pytest.fixture
def schema(database_url: str) -> Iterator[str]:
    """A schema of its own for one test, dropped afterwards (tests never see each other)."""
    name = f"t_{os.getpid()}_{next(_schemas)}"
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')
    yield name
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def make_outbox(database_url: str, schema: str):
    """Builds an ``Outbox`` on the test's schema; call ``.migrate()`` after registering kinds."""

    def make(**overrides) -> Outbox:
        return Outbox(database_url, schema=schema, **overrides)

    return make


@pytest.fixture
def conn(database_url: str) -> Iterator[psycopg.Connection]:
    with psycopg.connect(database_url) as connection:
        yield connection
