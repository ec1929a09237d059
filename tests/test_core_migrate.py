"""Migrations run once, under a lock, and kinds stay in step with what the application declares."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta

import psycopg
import pytest

from outbox import ActionKind, ActionRequest, KindConflictError, Outbox, enqueue
from outbox.cli import main
from outbox.migrate import available_migrations


def tables(database_url: str, schema: str) -> list[str]:
    with psycopg.connect(database_url) as conn:
        return [
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s"
                " ORDER BY 1",
                (schema,),
            )
        ]


def test_migrate_twice_is_a_no_op(make_outbox, database_url, schema):
    ob = make_outbox()
    first = ob.migrate()
    second = ob.migrate()
    assert first.applied == [f"{m.version:04d}_{m.name}" for m in available_migrations()]
    assert second.applied == [] and second.kinds_declared == []
    assert tables(database_url, schema) == [
        "agent_action",
        "agent_action_attempt",
        "agent_action_kind",
        "agent_action_kind_outage",
        "agent_action_kind_pause",
        "agent_action_lane",
        "agent_action_lane_intake",
        "agent_action_link",
        "agent_action_parked_payload",
        "agent_action_rate",
        "agent_action_resolution",
        "outbox_migration",
        "outbox_operator_audit",
        "outbox_process",
        "webhook_subscription",
    ]


def test_two_migrations_at_once_leave_one_consistent_schema(make_outbox, database_url, schema):
    reports, errors = [], []
    barrier = threading.Barrier(4)

    def run() -> None:
        try:
            barrier.wait()
            reports.append(make_outbox().migrate())
        except BaseException as error:
            errors.append(error)

    threads = [threading.Thread(target=run) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(len(r.applied) for r in reports) == [0, 0, 0, len(available_migrations())]
    with psycopg.connect(database_url) as conn:
        versions = conn.execute(f'SELECT count(*) FROM "{schema}".outbox_migration').fetchone()
    assert versions == (len(available_migrations()),)


def test_migrate_declares_the_applications_kinds_and_the_builtin_ones(make_outbox, conn, schema):
    ob = make_outbox()
    ob.declare(ActionKind("COMMENT", instance_level=False))
    ob.migrate()
    kinds = conn.execute(
        f'SELECT name, at_most_once, instance_level FROM "{schema}".agent_action_kind ORDER BY 1'
    ).fetchall()
    assert kinds == [
        ("CHAT_REPLY", False, False),
        ("COMMENT", False, False),
        ("EMAIL", True, True),
        ("ISSUE_COMMENT", False, False),
        ("WEBHOOK", False, True),
    ]


def test_a_flag_change_is_refused_while_the_kind_has_live_actions(
    make_outbox, database_url, schema
):
    before = make_outbox()
    before.declare(ActionKind("HOOK", at_most_once=False))
    before.migrate()
    with psycopg.connect(database_url) as conn:
        enqueue(conn, ActionRequest("HOOK", "l", "k", workspace_id="w"), schema=schema)
        conn.commit()
    after = make_outbox()
    after.declare(ActionKind("HOOK", at_most_once=True))
    with pytest.raises(KindConflictError, match=r"HOOK.*at_most_once.*1 of its actions"):
        after.migrate()
    with psycopg.connect(database_url) as conn:
        flags = conn.execute(
            f"SELECT at_most_once FROM \"{schema}\".agent_action_kind WHERE name = 'HOOK'"
        ).fetchone()
        assert flags == (False,)
        conn.execute(f'DELETE FROM "{schema}".agent_action')
        conn.commit()
    assert after.migrate().kinds_declared == ["HOOK"]


def test_the_builtin_email_kind_cannot_be_redeclared_differently(make_outbox):
    ob = make_outbox()
    with pytest.raises(KindConflictError):
        ob.declare(ActionKind("EMAIL", at_most_once=False, instance_level=True))


def test_cli_migrate_runs_from_the_environment(database_url, schema, monkeypatch, capsys):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database_url)
    monkeypatch.setenv("OUTBOX_SCHEMA", schema)
    assert main(["migrate"]) == 0
    assert "0001_core" in capsys.readouterr().out
    assert main(["migrate"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert Outbox().schema == schema


#: The outbox's key columns: compared byte by byte (``COLLATE "C"``) whatever the database's
#: collation, so that no index probe calls into a locale.
BYTEWISE_KEYS = {
    ("agent_action", "kind"),
    ("agent_action", "lane_key"),
    ("agent_action", "idempotency_key"),
    ("agent_action", "workspace_id"),
    ("agent_action", "limit_key"),
    ("agent_action", "subject_account_id"),
    ("agent_action_lane", "lane_key"),
    ("agent_action_lane", "head_kind"),
    ("agent_action_lane", "head_limit_key"),
    ("agent_action_lane_intake", "lane_key"),
    ("agent_action_lane_intake", "lane_keys"),
    ("agent_action_kind", "name"),
    ("agent_action_kind_pause", "kind"),
    ("agent_action_kind_outage", "kind"),
    ("agent_action_rate", "bucket"),
}


def test_the_key_columns_and_their_indexes_compare_bytewise(make_outbox, conn, schema):
    ob = make_outbox()
    ob.declare(ActionKind("ESCALATE"))
    ob.migrate()
    columns = {
        (table, column): collation
        for table, column, collation in conn.execute(
            "SELECT c.relname, a.attname, co.collname FROM pg_attribute a"
            " JOIN pg_class c ON c.oid = a.attrelid"
            " JOIN pg_collation co ON co.oid = a.attcollation"
            " WHERE c.relnamespace = %s::regnamespace AND c.relkind = 'r' AND a.attnum > 0",
            (schema,),
        )
    }
    assert {key: columns[key] for key in BYTEWISE_KEYS} == dict.fromkeys(BYTEWISE_KEYS, "C")
    # Every index key on them was rebuilt with the column's collation.
    index_keys = conn.execute(
        "SELECT t.relname, a.attname, co.collname FROM pg_index i"
        " JOIN pg_class t ON t.oid = i.indrelid"
        " CROSS JOIN LATERAL unnest(i.indkey, i.indcollation) AS k(attnum, coll)"
        " JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum"
        " JOIN pg_collation co ON co.oid = k.coll"
        " WHERE t.relnamespace = %s::regnamespace",
        (schema,),
    ).fetchall()
    on_keys = [
        (table, column, coll)
        for table, column, coll in index_keys
        if (table, column) in BYTEWISE_KEYS
    ]
    assert len(on_keys) >= 8 and all(coll == "C" for _, _, coll in on_keys), on_keys
    # A kind is still refused a rename while actions name it (its trigger was made again).
    enqueue(
        conn,
        ActionRequest(kind="ESCALATE", lane_key="l", idempotency_key="k", workspace_id="w"),
        schema=schema,
    )
    with pytest.raises(psycopg.errors.ForeignKeyViolation):
        conn.execute(
            f"UPDATE {schema}.agent_action_kind SET name = 'RENAMED' WHERE name = 'ESCALATE'"
        )


def test_an_upgrade_keeps_the_lanes_scheduled_before_it_out_of_the_claims_index(
    make_outbox, conn, schema, monkeypatch
):
    """Lanes folded before migration 0031 (one head scheduled for tomorrow, one due) come out of
    it marked as their heads are: a claim then takes the due one alone."""
    import outbox.migrate as migrate_module

    every = available_migrations()
    monkeypatch.setattr(
        migrate_module, "available_migrations", lambda: [m for m in every if m.version < 31]
    )
    ob = make_outbox()
    ob.declare(ActionKind("NOTE"))
    ob.migrate()
    tomorrow = conn.execute("SELECT now() + interval '1 day'").fetchone()[0]
    requests = [
        ActionRequest(
            "NOTE", lane_key="later", idempotency_key="later", workspace_id="w", not_before=tomorrow
        ),
        ActionRequest("NOTE", lane_key="due", idempotency_key="due", workspace_id="w"),
    ]
    due = [enqueue(conn, request, schema=schema) for request in requests][1]
    conn.execute(f'SELECT "{schema}".agent_action_lane_intake(100)')
    conn.commit()
    monkeypatch.setattr(migrate_module, "available_migrations", lambda: every)
    assert ob.migrate().applied[0].startswith("0031_")
    flags = conn.execute(
        f'SELECT lane_key, head_scheduled FROM "{schema}".agent_action_lane ORDER BY 1'
    ).fetchall()
    assert flags == [("due", False), ("later", True)]
    conn.rollback()

    async def claim():
        async with ob.store() as store:
            return await store.claim({"NOTE": 10}, timedelta(minutes=5), take=False)

    assert [c.action.id for c in asyncio.run(claim())] == [due.id]
