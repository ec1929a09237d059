"""Pausing a kind: the claimers claim none of its actions (neither lane heads nor reclaims)
until it is resumed. The claimers read the paused kinds once a round, in the statement that
already counts what is in flight (``executing_by_kind``), so a pause costs the claim nothing."""

from __future__ import annotations

from typing import Any

from psycopg import Connection

from outbox._io import Operation, Statement, run_sync
from outbox.enqueuing import default_schema
from outbox.errors import UnknownKindError
from outbox.operator.audit import audit_operation, checked_actor
from outbox.operator.records import KindPause
from outbox.queries import queries_for


def paused_kinds_operation(schema: str) -> Operation[list[KindPause]]:
    rows = yield Statement(queries_for(schema)["paused_kinds"])
    return [KindPause(**r) for r in rows]


def paused_kinds(conn: Connection[Any], *, schema: str | None = None) -> list[KindPause]:
    """The paused kinds, by name."""
    return run_sync(conn, paused_kinds_operation(schema or default_schema()))


def pause(
    conn: Connection[Any],
    kind: str,
    *,
    actor: str,
    note: str | None = None,
    schema: str | None = None,
) -> KindPause:
    """Pauses ``kind`` (a declared kind, else ``UnknownKindError``); pausing a paused kind
    changes nothing and returns the existing pause. Actions already executing run on."""
    schema = schema or default_schema()
    actor = checked_actor(actor)

    def op() -> Operation[KindPause]:
        q = queries_for(schema)
        if not (yield Statement(q["kind_exists"], {"kind": kind})):
            raise UnknownKindError(kind)
        rows = yield Statement(q["pause_kind"], {"kind": kind, "actor": actor, "note": note})
        outcome = "applied" if rows else "unchanged"
        if not rows:
            rows = yield Statement(q["pause_of_kind"], {"kind": kind})
        yield from audit_operation(
            schema, actor, "pause", kind=kind, outcome=outcome, detail={"note": note}
        )
        return KindPause(**rows[0])

    with conn.transaction():
        return run_sync(conn, op())


def resume(conn: Connection[Any], kind: str, *, actor: str, schema: str | None = None) -> bool:
    """Resumes ``kind``; True when it was paused, or held by its provider's outage
    (``outbox.provider_outage``: an operator who knows the provider is back need not wait for
    the hold to end). The claimers claim it again from their next round."""
    schema = schema or default_schema()
    actor = checked_actor(actor)

    def op() -> Operation[bool]:
        rows = yield Statement(queries_for(schema)["resume_kind"], {"kind": kind})
        yield from audit_operation(
            schema, actor, "resume", kind=kind, outcome="applied" if rows else "unchanged"
        )
        return bool(rows)

    with conn.transaction():
        return run_sync(conn, op())
