"""Shared fixtures: the real PostgreSQL (and brokers) from the environment, a fresh schema a test.

URLs come from OUTBOX_TEST_DATABASE_URL / OUTBOX_TEST_REDIS_URL / OUTBOX_TEST_RABBITMQ_URL and
default to the local services. Where PostgreSQL does not answer and Docker runs, testcontainers
starts one. A service that does not answer skips the tests that need it, with a reason naming it;
in CI (``CI=true``) it fails them instead, because a green run that tested nothing is worse than
a red one.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator

import psycopg
import pytest

from outbox import Outbox
from tests.services import missing_service, reachable, require_reachable

DEFAULT_DATABASE_URL = "postgresql://postgres@127.0.0.1:5432/test"
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/15"
DEFAULT_RABBITMQ_URL = "amqp://guest:guest@127.0.0.1:5672/%2F"

_schemas = itertools.count()


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
    if reachable(url, 5432) or not _docker_available():
        yield require_reachable("PostgreSQL", url, 5432)
        return
    from testcontainers.postgres import PostgresContainer  # type: ignore[import-not-found]

    with PostgresContainer("postgres:15", driver=None) as container:
        yield container.get_connection_url()


@pytest.fixture(scope="session")
def redis_url() -> str:
    url = os.environ.get("OUTBOX_TEST_REDIS_URL", DEFAULT_REDIS_URL)
    return require_reachable("Redis", url, 6379)


@pytest.fixture(scope="session")
def rabbitmq_url() -> str:
    url = os.environ.get("OUTBOX_TEST_RABBITMQ_URL", DEFAULT_RABBITMQ_URL)
    return require_reachable("RabbitMQ", url, 5672)


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


def _require_server_binaries() -> None:
    from benchmarks.chaos.servers import missing_binaries

    missing = missing_binaries()
    if missing:
        missing_service(missing)


@pytest.fixture
def private_postgres():
    """A PostgreSQL of the test's own on its own port (a fault test stops and restarts it,
    never the shared one), removed after the test."""
    from benchmarks.chaos.servers import PrivatePostgres

    _require_server_binaries()
    with PrivatePostgres() as server:
        yield server


@pytest.fixture
def private_redis():
    """A Redis of the test's own on its own port, removed after the test."""
    from benchmarks.chaos.servers import PrivateRedis

    _require_server_binaries()
    with PrivateRedis() as server:
        yield server
