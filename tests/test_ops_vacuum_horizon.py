"""What holds the vacuum horizon: a session with an open snapshot or transaction id is listed
(pid, role, state, how long), one without either is not, one that ended is gone; a replica's
slot and a replica's feedback are listed by how many transactions back they hold it, an
inactive slot at once (on a private primary with real standbys); ``outbox status`` says so in
words and in JSON, and the housekeeping's gauges read the longest hold and the oldest one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from datetime import timedelta

import psycopg
import pytest
from prometheus_client import REGISTRY

from benchmarks.chaos.servers import PrivatePostgres, PrivateStandby, missing_binaries
from outbox._io import run_sync
from outbox.maintenance.gauges import refresh_backlog_gauges
from outbox.metrics import set_vacuum_horizon_gauges
from outbox.status import StatusReport, render_status, status
from outbox.vacuum_horizon import (
    HELD_TOO_LONG,
    HELD_TOO_MANY_XIDS,
    describe_holder,
    horizon_holders_operation,
)
from tests.services import missing_service

#: How long each test's session holds what it holds before it is read.
HELD = 0.4


@pytest.fixture
def outbox(make_outbox):
    ob = make_outbox()
    ob.migrate()
    return ob


@pytest.fixture
def holder(database_url) -> Iterator[psycopg.Connection]:
    """Another session of the test's database, its transaction rolled back at the end."""
    with psycopg.connect(database_url, application_name="nightly report") as conn:
        yield conn
        conn.rollback()


def holders(conn: psycopg.Connection, schema: str, older_than: float = 0.2) -> dict:
    """The holders older than ``older_than`` seconds, by pid (sessions only)."""
    listed = run_sync(conn, horizon_holders_operation(schema, timedelta(seconds=older_than), 50))
    conn.rollback()
    return {row["pid"]: row for row in listed if row["holder"] == "session"}


def test_a_snapshot_held_open_is_listed_until_it_ends(outbox, conn, schema, holder):
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")  # the snapshot is taken at the first read
    time.sleep(HELD)
    pid = holder.info.backend_pid
    row = holders(conn, schema)[pid]
    assert row["state"] == "idle in transaction"
    assert row["name"] == "nightly report" and row["role"]
    assert HELD <= row["held_s"] < HELD + 30
    # Not yet older than asked for: not listed.
    assert pid not in holders(conn, schema, older_than=60)
    holder.rollback()
    assert pid not in holders(conn, schema, older_than=0)


def test_an_open_transaction_holds_it_once_it_has_an_id_not_before(outbox, conn, schema, holder):
    # READ COMMITTED keeps no snapshot between statements: an idle transaction that has written
    # nothing holds nothing back.
    holder.execute("SELECT 1")
    time.sleep(HELD)
    pid = holder.info.backend_pid
    assert pid not in holders(conn, schema)
    # A transaction id (any write takes one) holds it from then on, until the transaction ends.
    holder.execute("SELECT pg_current_xact_id()")
    assert holders(conn, schema)[pid]["held_s"] >= HELD
    holder.commit()
    assert pid not in holders(conn, schema, older_than=0)


def test_status_says_what_holds_it_and_for_how_long(outbox, conn, schema, holder):
    assert "vacuum horizon: nothing seen holding it for over 60s" in render_status(StatusReport())
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    time.sleep(HELD)
    listed = [holders(conn, schema)[holder.info.backend_pid]]
    text = render_status(StatusReport(vacuum_horizon=listed))
    assert "vacuum horizon held back" in text
    assert (
        f"session pid {holder.info.backend_pid} (role {listed[0]['role']}, 'nightly report', "
        "idle in transaction) open for 0s"
    ) in text
    # The real report lists only holds over HELD_TOO_LONG: this one is not, yet.
    report = status(conn, schema=schema)
    conn.rollback()
    assert holder.info.backend_pid not in {h["pid"] for h in report.vacuum_horizon}
    assert all(h["held_s"] > HELD_TOO_LONG.total_seconds() for h in report.vacuum_horizon)
    assert "vacuum_horizon" in report.as_dict()


def test_a_prepared_transaction_is_described_by_its_name_and_age():
    said = describe_holder(
        {
            "holder": "prepared transaction",
            "pid": None,
            "role": "app",
            "name": "order-17",
            "state": "prepared",
            "held_s": 3725.0,
        }
    )
    assert said == "prepared transaction 'order-17' (role app) prepared 62m 5s ago"


def test_the_housekeeping_gauge_reads_the_longest_hold(outbox, schema, holder):
    holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
    holder.execute("SELECT 1")
    time.sleep(HELD)

    async def refresh() -> None:
        async with outbox.store() as store:
            await refresh_backlog_gauges(store)

    # A transaction that commits after the snapshot was taken: the snapshot is one back.
    with psycopg.connect(holder.info.dsn, autocommit=True) as other:
        other.execute("SELECT pg_current_xact_id()")
    asyncio.run(refresh())
    # At least this session's hold (another session of the server may hold it longer).
    assert REGISTRY.get_sample_value("outbox_vacuum_horizon_held_seconds") >= HELD
    assert REGISTRY.get_sample_value("outbox_vacuum_horizon_held_xids") >= 1


#: Transactions the primary commits while a standby's snapshot is held open.
WRITES = 40


def _xids_back(conn: psycopg.Connection, older_than_xids: int) -> dict[tuple[str, str], dict]:
    """The slots and replicas listed at ``older_than_xids``, by (holder, name)."""
    listed = run_sync(
        conn, horizon_holders_operation("outbox", limit=None, older_than_xids=older_than_xids)
    )
    return {(row["holder"], row["name"]): row for row in listed if row["held_s"] is None}


def _until(found: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        assert time.monotonic() < deadline, f"not seen within {timeout}s: {what}"
        time.sleep(0.2)


def test_a_replicas_slot_and_feedback_are_listed_by_how_far_back_they_hold_it():
    missing = missing_binaries()
    if missing:
        missing_service(missing)
    with (
        PrivatePostgres() as primary,
        PrivateStandby(primary, slot="reports_replica") as slotted,
        PrivateStandby(primary) as unslotted,
        psycopg.connect(primary.url, autocommit=True) as conn,
    ):
        # Each standby runs a report: a snapshot held open, which its feedback reports.
        reports = [psycopg.connect(standby.url) for standby in (slotted, unslotted)]
        for report in reports:
            report.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
            report.execute("SELECT 1")
        for _ in range(WRITES):
            conn.execute("SELECT pg_current_xact_id()")
        slot = ("replication slot", "reports_replica")
        replica = ("replica", "walreceiver")
        _until(
            lambda: {slot, replica} <= _xids_back(conn, WRITES).keys(),
            "both standbys' feedback holding the horizon",
        )
        listed = _xids_back(conn, WRITES)
        assert listed[slot]["state"] == "active" and listed[slot]["pid"]
        assert listed[slot]["xid_age"] >= WRITES and listed[replica]["xid_age"] >= WRITES
        assert describe_holder(listed[slot]) == (
            f"replication slot 'reports_replica' (read by pid {listed[slot]['pid']}) "
            f"{listed[slot]['xid_age']:,} transactions back"
        )
        assert describe_holder(listed[replica]).startswith(
            f"replica 'walreceiver', pid {listed[replica]['pid']} (role postgres, "
            "hot_standby_feedback) "
        )
        # Not yet as far back as the default asks: a replica's feedback trails by that much.
        assert _xids_back(conn, HELD_TOO_MANY_XIDS) == {}
        # The gauge counts every holder, whatever its age.
        set_vacuum_horizon_gauges(
            run_sync(conn, horizon_holders_operation("outbox", timedelta(0), None, 0))
        )
        assert REGISTRY.get_sample_value("outbox_vacuum_horizon_held_xids") >= WRITES

        # The slotted standby goes away with its report open: its slot keeps the horizon
        # where the report held it, and is listed at once, at any age.
        reports[0].close()
        slotted.stop()
        _until(
            lambda: _xids_back(conn, HELD_TOO_MANY_XIDS).get(slot, {}).get("state") == "inactive",
            "the slot inactive",
        )
        inactive = _xids_back(conn, HELD_TOO_MANY_XIDS)[slot]
        assert inactive["pid"] is None and inactive["xid_age"] >= WRITES
        assert describe_holder(inactive).startswith(
            "replication slot 'reports_replica' (inactive: no replica reads it) "
        )
        text = render_status(StatusReport(vacuum_horizon=[inactive]))
        assert "vacuum horizon held back" in text and "'reports_replica' (inactive" in text

        # The other report ends: that replica's feedback moves on and it is no longer listed.
        reports[1].rollback()
        _until(lambda: replica not in _xids_back(conn, WRITES), "the replica's feedback moved on")
        reports[1].close()
        # A dropped slot holds nothing; a healthy replica's feedback is always a few back.
        conn.execute("SELECT pg_drop_replication_slot('reports_replica')")
        assert _xids_back(conn, 0).keys() == {replica}
