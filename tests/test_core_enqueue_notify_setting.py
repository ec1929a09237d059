"""``outbox.enqueue_notify``: the PostgreSQL setting that leaves an enqueue's NOTIFY out.

An enqueue's transaction notifies the claimers unless the setting is off (for a database, a
role, a connection, a session or one transaction); claimers then find the action at their poll.
Any other value keeps the NOTIFY and never fails the application's insert.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
import uuid
from collections.abc import Iterator
from datetime import timedelta

import psycopg
import pytest
from psycopg import sql

from outbox import ActionKind, ActionRequest, enqueue, enqueue_many
from outbox.dispatch import Claimer, broker_from_url, install
from outbox.status import render_status, status
from tests.apps import dispatch_app
from tests.support import rows

NOTE = ActionKind("NOTE")
MEMO = ActionKind("MEMO")
#: How long a test waits for a NOTIFY that must not come (one that comes does within
#: milliseconds of the commit).
QUIET = 1.0
#: The spellings that turn it off; any other value leaves the NOTIFY in.
OFF = ("off", "OFF", "false", "no", "0")
ON = ("on", "true", "yes", "1", "maybe", "")


@pytest.fixture
def outbox(make_outbox):
    ob = make_outbox()
    ob.declare(NOTE)
    ob.declare(MEMO)
    ob.migrate()
    return ob


def request(key: str, kind: ActionKind = NOTE) -> ActionRequest:
    return ActionRequest(kind=kind, lane_key=f"lane-{key}", idempotency_key=key, workspace_id="w")


def notified(listener: psycopg.Connection, timeout: float = QUIET) -> int:
    """How many notifications the listener received within ``timeout``."""
    return len(list(listener.notifies(timeout=timeout, stop_after=1)))


@pytest.fixture
def listener(database_url, schema):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'LISTEN "outbox_{schema}"')
        yield conn


@pytest.mark.parametrize("value", OFF)
def test_an_enqueue_of_a_session_with_the_setting_off_sends_no_notify(
    outbox, database_url, schema, listener, value
):
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT set_config('outbox.enqueue_notify', %s, false)", (value,))
        conn.commit()
        enqueue(conn, request("quiet"), schema=schema)
        conn.commit()
        assert notified(listener) == 0
        # The action is there all the same, waiting for a claimer's poll.
        assert [r["idempotency_key"] for r in rows(conn, schema)] == ["quiet"]
        conn.execute("RESET outbox.enqueue_notify")
        enqueue(conn, request("loud"), schema=schema)
        conn.commit()
    assert notified(listener, timeout=5) == 1


@pytest.mark.parametrize("value", ON)
def test_any_other_value_keeps_the_notify_and_never_fails_the_insert(
    outbox, database_url, schema, listener, value
):
    with psycopg.connect(database_url) as conn:
        conn.execute("SELECT set_config('outbox.enqueue_notify', %s, false)", (value,))
        action = enqueue(conn, request("k"), schema=schema)
        conn.commit()
    assert action.created
    assert notified(listener, timeout=5) == 1


def test_a_connection_can_turn_it_off_as_a_role_or_database_default_would(
    outbox, database_url, schema, listener
):
    # `options` sets the session's default at connection, as ALTER ROLE/DATABASE ... SET does.
    with psycopg.connect(database_url, options="-c outbox.enqueue_notify=off") as conn:
        enqueue(conn, request("quiet"), schema=schema)
        conn.commit()
    assert notified(listener) == 0


def test_set_local_turns_it_off_for_one_transaction_only(outbox, database_url, schema, listener):
    with psycopg.connect(database_url) as conn:
        conn.execute("SET LOCAL outbox.enqueue_notify = off")
        enqueue(conn, request("quiet"), schema=schema)
        conn.commit()
        assert notified(listener) == 0
        enqueue(conn, request("loud"), schema=schema)
        conn.commit()
    assert notified(listener, timeout=5) == 1


@pytest.mark.parametrize("kinds", [(NOTE, NOTE), (NOTE, MEMO)], ids=["one-kind", "two-kinds"])
def test_enqueue_many_obeys_it_whatever_the_kinds_of_its_batch(
    outbox, database_url, schema, listener, kinds
):
    batch = [request(f"k{i}", kind) for i, kind in enumerate(kinds)]
    with psycopg.connect(database_url) as conn:
        conn.execute("SET outbox.enqueue_notify = off")
        assert len(enqueue_many(conn, batch, schema=schema)) == 2
        conn.commit()
        assert notified(listener) == 0
        conn.execute("SET outbox.enqueue_notify = on")
        enqueue_many(
            conn, [request(f"k{i + 2}", kind) for i, kind in enumerate(kinds)], schema=schema
        )
        conn.commit()
    assert notified(listener, timeout=5) == 1


async def test_a_claimer_finds_a_quiet_enqueue_at_its_poll_not_before(
    make_outbox, schema: str, redis_url: str
) -> None:
    url = make_outbox().settings.require_database_url()
    poll = 3.0
    outbox = dispatch_app.build(url, schema, schema.upper(), poll_interval=timedelta(seconds=poll))
    outbox.migrate()
    rb, _ = dispatch_app.kinds(schema.upper())
    dispatch = install(outbox, broker_from_url(redis_url))
    stop = asyncio.Event()

    def enqueue_quietly() -> None:
        with psycopg.connect(url, options="-c outbox.enqueue_notify=off") as conn:
            outbox.enqueue(
                conn, ActionRequest(rb, lane_key="l", idempotency_key="k", workspace_id="w")
            )

    async with outbox.store() as store:
        claimer = Claimer(dispatch, store)
        running = asyncio.create_task(claimer.run(stop))
        try:
            await asyncio.sleep(0.5)  # its first round found nothing; it waits for a wake or a poll
            enqueued = time.monotonic()
            await asyncio.to_thread(enqueue_quietly)
            while claimer.totals["pushed"] < 1:
                assert time.monotonic() - enqueued < poll + 2, "the poll did not find it"
                await asyncio.sleep(0.02)
            # No NOTIFY woke it: the poll did, up to a poll interval after its last round.
            assert time.monotonic() - enqueued > QUIET
        finally:
            stop.set()
            await asyncio.wait_for(running, 10)


#: The claimer's start-up line about them.
QUIET_EVENT = "enqueue_notify_off"


@pytest.fixture
def quiet_role(database_url: str) -> Iterator[str]:
    """A login role of its own whose default in this database turns the NOTIFY off, as
    ``ALTER ROLE app IN DATABASE db SET outbox.enqueue_notify = off`` does for an application
    (roles are the cluster's, not the test's schema's: dropped afterwards, with the setting). It
    has the privileges of the role that runs the tests."""
    name = f"outbox_quiet_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    role = sql.Identifier(name)
    with psycopg.connect(database_url, autocommit=True) as admin:
        database = sql.Identifier(admin.info.dbname)
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(role))
        try:
            runner = sql.Identifier(admin.info.user)
            admin.execute(sql.SQL("GRANT {} TO {}").format(runner, role))
            admin.execute(
                sql.SQL("ALTER ROLE {} IN DATABASE {} SET outbox.enqueue_notify = 'OFF'").format(
                    role, database
                )
            )
            yield name
        finally:
            admin.execute(sql.SQL("DROP ROLE {}").format(role))


def test_a_role_whose_default_is_off_enqueues_without_a_notify_and_status_says_so(
    outbox, database_url, schema, listener, quiet_role
):
    with psycopg.connect(database_url, user=quiet_role) as conn:
        assert conn.execute("SHOW outbox.enqueue_notify").fetchone() == ("OFF",)
        enqueue(conn, request("quiet"), schema=schema)
        conn.commit()
    assert notified(listener) == 0
    with psycopg.connect(database_url) as conn:
        report = status(conn, schema=schema)
        database = conn.info.dbname
    assert {"role": quiet_role, "database": database} in report.enqueue_notify_off
    assert f"role {quiet_role} in this database" in render_status(report)


def test_status_says_the_notify_is_on_when_nobody_turned_it_off(outbox, conn, schema):
    report = status(conn, schema=schema)
    if not report.enqueue_notify_off:  # another role of this cluster may have it off
        assert "enqueue NOTIFY: on" in render_status(report)
    assert report.as_dict()["enqueue_notify_off"] == report.enqueue_notify_off


async def test_a_claimer_says_at_start_whose_enqueues_it_finds_at_its_poll_only(
    make_outbox, schema: str, redis_url: str, quiet_role: str, caplog
) -> None:
    url = make_outbox().settings.require_database_url()
    outbox = dispatch_app.build(url, schema, schema.upper(), poll_interval=timedelta(seconds=0.4))
    outbox.migrate()
    dispatch = install(outbox, broker_from_url(redis_url))
    stop = asyncio.Event()
    caplog.set_level(logging.INFO, logger="outbox.claimer")
    async with outbox.store() as store:
        running = asyncio.create_task(Claimer(dispatch, store).run(stop))
        await asyncio.sleep(0.5)
        stop.set()
        await asyncio.wait_for(running, 10)
    said = [
        r.getMessage() for r in caplog.records if getattr(r, "event", "") == "enqueue_notify_off"
    ]
    assert len(said) == 1, said
    assert f"role {quiet_role} in this database" in said[0] and "every 0.4s here" in said[0]
