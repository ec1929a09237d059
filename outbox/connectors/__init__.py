"""Connectors: every statement of the outbox is a ``Statement`` in ``sql/queries.sql``'s pyformat
placeholders (``%(name)s``), and an operation (``outbox._io``) yields them; a connector runs an
operation on the caller's connection, in the caller's transaction, whatever drives it.

One module a driver or framework:

- ``on_psycopg``: psycopg 3 ``Connection`` / ``AsyncConnection`` (the native driver);
- ``on_psycopg2``: psycopg2 connections (the same placeholders; JSON wrapped for psycopg2);
- ``on_asyncpg``: asyncpg connections (numbered ``$n`` placeholders, from ``outbox.placeholders``);
- ``on_sqlalchemy``: SQLAlchemy sessions and connections, sync and asyncio, on any of these;
- ``on_django``: Django's connection inside ``transaction.atomic()`` (psycopg 3 or psycopg2).

``run_sync_on`` and ``run_async_on`` pick the connector; anything else is refused with one line
naming its type (``UnusableConnection``). No driver or framework is imported unless the caller
gave one of its objects.
"""

from __future__ import annotations

from typing import Any, TypeVar

from psycopg import AsyncConnection, Connection

from outbox._io import Operation
from outbox.connectors import on_asyncpg, on_django, on_psycopg, on_psycopg2, on_sqlalchemy
from outbox.errors import UnusableConnection

T = TypeVar("T")

#: What the sync calls take, and the async ones, for the messages.
SYNC_KINDS = (
    "a psycopg Connection, a psycopg2 connection, a SQLAlchemy Session/Connection, or Django's "
    "connection inside transaction.atomic()"
)
ASYNC_KINDS = (
    "a psycopg AsyncConnection, an asyncpg Connection in a transaction, or a SQLAlchemy "
    "AsyncSession/AsyncConnection"
)


def _module(conn: Any) -> str:
    return type(conn).__module__


def _is_psycopg2(conn: Any) -> bool:
    return _module(conn).startswith("psycopg2")


def _is_asyncpg(conn: Any) -> bool:
    return _module(conn).startswith("asyncpg")


def is_async(conn: Any) -> bool:
    return (
        isinstance(conn, AsyncConnection)
        or _is_asyncpg(conn)
        or on_sqlalchemy.is_sqlalchemy_async(conn)
    )


def _unknown(conn: Any, caller: str, kinds: str) -> UnusableConnection:
    name = type(conn).__name__
    return UnusableConnection(f"{caller} cannot use {name} ({_module(conn)}.{name}): give {kinds}")


def run_sync_on(conn: Any, op: Operation[T], caller: str, async_twin: str | None = None) -> T:
    """Runs ``op`` on ``conn`` (see the module's list); ``caller`` is the function the caller
    called, ``async_twin`` the one to call with an async connection instead."""
    if isinstance(conn, Connection):
        return on_psycopg.run(conn, op, caller)
    if is_async(conn):
        instead = f"call {async_twin} with it, or give {caller}" if async_twin else "give it"
        raise UnusableConnection(
            f"{caller} runs on a sync connection but got an async {type(conn).__name__}: "
            f"{instead} {SYNC_KINDS}"
        )
    if _is_psycopg2(conn):
        return on_psycopg2.run(conn, op, caller)
    if on_django.is_django(conn):
        wrapper = conn
        driver = on_django.driver_connection(wrapper, caller)
        if isinstance(driver, Connection):
            return on_django.run_marking_rollback(
                wrapper, lambda: on_psycopg.run(driver, op, caller, text_json=True)
            )
        return on_django.run_marking_rollback(wrapper, lambda: on_psycopg2.run(driver, op, caller))
    if on_sqlalchemy.is_sqlalchemy(conn):
        driver = on_sqlalchemy.driver_connection(conn)
        if isinstance(driver, Connection):
            return on_psycopg.run(driver, op, caller)
        if _is_psycopg2(driver):
            return on_psycopg2.run(driver, op, caller)
        raise UnusableConnection(
            f"{caller} cannot use a SQLAlchemy {type(conn).__name__} on "
            f"{type(driver).__module__}.{type(driver).__name__}: use the psycopg or psycopg2 "
            "driver (postgresql+psycopg:// or postgresql+psycopg2://)"
        )
    raise _unknown(conn, caller, SYNC_KINDS)


async def run_async_on(conn: Any, op: Operation[T], caller: str, sync_twin: str) -> T:
    """The async twin of ``run_sync_on``; ``sync_twin`` is the function a sync connection
    takes."""
    if isinstance(conn, AsyncConnection):
        return await on_psycopg.run_on_async(conn, op, caller)
    if _is_asyncpg(conn):
        return await on_asyncpg.run(conn, op, caller)
    if on_sqlalchemy.is_sqlalchemy_async(conn):
        driver = await on_sqlalchemy.async_driver_connection(conn)
        if isinstance(driver, AsyncConnection):
            return await on_psycopg.run_on_async(driver, op, caller)
        if _is_asyncpg(driver):
            # SQLAlchemy's asyncpg dialect installs a jsonb codec that decodes.
            return await on_asyncpg.run(driver, op, caller, json_decoded=True)
        raise UnusableConnection(
            f"{caller} cannot use a SQLAlchemy {type(conn).__name__} on "
            f"{type(driver).__module__}.{type(driver).__name__}: use postgresql+asyncpg:// or "
            "postgresql+psycopg://"
        )
    if (
        isinstance(conn, Connection)
        or _is_psycopg2(conn)
        or on_django.is_django(conn)
        or on_sqlalchemy.is_sqlalchemy(conn)
    ):
        raise UnusableConnection(
            f"{caller} runs on an async connection but got a sync {type(conn).__name__}: call "
            f"{sync_twin} with it, or give {caller} {ASYNC_KINDS}"
        )
    raise _unknown(conn, caller, ASYNC_KINDS)
