"""The demo's own schema: created by the demo, marked as the demo's, and dropped by its next run
only while it still is the demo's.

The mark is a comment on the schema plus a table of the ids of the actions the demo enqueued
(written in the transaction of each enqueue). A schema is dropped only when it bears the mark
and holds no action outside that table; any other schema (the one a claimer, a worker pool or
an application uses, or a demo schema somebody then enqueued into) is refused with one line and
left as it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import psycopg
from psycopg import sql

from outbox.errors import OutboxError
from outbox.queries import validate_schema

#: The demo's own schema unless ``outbox demo --schema`` names another. Not ``OUTBOX_SCHEMA``: that
#: is the schema of the claimers, workers and applications the demo must never touch.
DEMO_SCHEMA = "outbox_demo"
#: The comment that marks a schema as one ``outbox demo`` created.
MARK = "outbox demo: created by `outbox demo`, which drops and creates it anew on its next run"
#: The table of the ids of the actions the demo enqueued.
DEMO_ACTIONS = "outbox_demo_action"


class DemoSchemaRefused(OutboxError):
    """The demo's schema exists and is not (only) the demo's: it is left as it is."""


def _state(conn: psycopg.Connection[Any], schema: str) -> tuple[bool, bool, int, int]:
    """Whether the schema exists, whether it bears the mark, how many actions it holds, and how
    many of them the demo did not enqueue."""
    exists, comment, has_actions, has_ids = conn.execute(
        "SELECT n.oid IS NOT NULL, obj_description(n.oid, 'pg_namespace'),"
        " to_regclass(format('%%I.agent_action', %(s)s::text)) IS NOT NULL,"
        " to_regclass(format('%%I.%%I', %(s)s::text, %(t)s::text)) IS NOT NULL"
        " FROM (SELECT 1) one LEFT JOIN pg_namespace n ON n.nspname = %(s)s",
        {"s": schema, "t": DEMO_ACTIONS},
    ).fetchone() or (False, None, False, False)
    if not exists or not has_actions:
        return bool(exists), comment == MARK and has_ids, 0, 0
    if not has_ids:
        total = conn.execute(
            sql.SQL("SELECT count(*) FROM {}.agent_action").format(sql.Identifier(schema))
        ).fetchone()
        n = int(total[0]) if total else 0
        return True, False, n, n
    counted = conn.execute(
        sql.SQL(
            "SELECT count(*), count(*) FILTER (WHERE d.id IS NULL)"
            " FROM {s}.agent_action a LEFT JOIN {s}.{t} d ON d.id = a.id"
        ).format(s=sql.Identifier(schema), t=sql.Identifier(DEMO_ACTIONS))
    ).fetchone()
    total, foreign = (int(counted[0]), int(counted[1])) if counted else (0, 0)
    return True, comment == MARK, total, foreign


def fresh_demo_schema(database_url: str, schema: str) -> None:
    """Drops ``schema`` if it is the demo's own, then creates it anew, marked.

    Raises ``DemoSchemaRefused`` (and changes nothing) when the schema exists without the mark,
    or holds actions the demo did not enqueue.
    """
    validate_schema(schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        exists, marked, total, foreign = _state(conn, schema)
        instead = "run the demo in a schema of its own: outbox demo --schema NAME"
        if exists and not marked:
            holds = f"it holds {total:,} actions" if total else "it may be in use"
            raise DemoSchemaRefused(
                f"schema {schema} exists and was not created by outbox demo ({holds}): the demo "
                f"never drops it; {instead}"
            )
        if foreign:
            raise DemoSchemaRefused(
                f"schema {schema} holds {foreign:,} actions the demo did not enqueue: the demo "
                f"never drops it; {instead}"
            )
        with conn.transaction():
            if exists:
                conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(schema)))
            conn.execute(
                sql.SQL("COMMENT ON SCHEMA {} IS {}").format(
                    sql.Identifier(schema), sql.Literal(MARK)
                )
            )
            conn.execute(
                sql.SQL("CREATE TABLE {}.{} (id bigint PRIMARY KEY)").format(
                    sql.Identifier(schema), sql.Identifier(DEMO_ACTIONS)
                )
            )


def record_demo_actions(conn: psycopg.Connection[Any], schema: str, ids: Iterable[int]) -> None:
    """Notes actions as the demo's, in the caller's transaction (that of their enqueue)."""
    with conn.cursor() as cur:
        cur.executemany(
            sql.SQL("INSERT INTO {}.{} (id) VALUES (%s) ON CONFLICT DO NOTHING").format(
                sql.Identifier(schema), sql.Identifier(DEMO_ACTIONS)
            ),
            [(i,) for i in ids],
        )
