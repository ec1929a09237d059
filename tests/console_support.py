"""What the console tests share: a populated schema (every state, an UNCERTAIN email-like
action with a Message-ID on its attempt), and a console served by waitress on a free port."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool

from outbox import ActionKind, ActionRequest, Done, Failed, Uncertain, enqueue
from outbox.console import create_app, serve
from outbox.testing import drain
from tests.support import ScriptedAdapter

NOTE = ActionKind("NOTE")
MESSAGE_ID = "message-id=<outbox.lost-3@example.test>"
ARTIFACTS = Path(__file__).parent / "artifacts"


def populate(make_outbox, database_url: str, schema: str) -> dict[str, int]:
    """Two DONE, one FAILED, one UNCERTAIN (its attempt carries a Message-ID), one waiting."""
    script = {
        "ok": Done("250 queued"),
        "refused": Failed("SMTP_RCPT_550"),
        "lost": Uncertain("SMTP_DATA_TIMEOUT"),
    }
    ob = make_outbox()
    ob.register(NOTE, ScriptedAdapter(lambda a: script[a.payload["what"]]))
    ob.migrate()
    ids: dict[str, int] = {}
    with psycopg.connect(database_url) as conn:
        for what in ("ok", "ok", "refused", "lost"):
            request = ActionRequest(
                NOTE, f"lane-{what}", f"{what}-{len(ids)}", {"what": what}, workspace_id="w"
            )
            ids[what] = enqueue(conn, request, schema=schema).id
        conn.commit()
    drain(ob)
    with psycopg.connect(database_url, autocommit=True) as conn:
        # The provider's reference as an email adapter records it on its attempt.
        conn.execute(
            f'UPDATE "{schema}".agent_action_attempt SET provider_ref = %s WHERE action_id = %s',
            (MESSAGE_ID, ids["lost"]),
        )
        waiting = enqueue(
            conn, ActionRequest(NOTE, "lane-wait", "waiting", workspace_id="w"), schema=schema
        )
    ids["waiting"] = waiting.id
    return ids


@dataclass
class Console:
    url: str
    server: object


@contextmanager
def running_console(
    database_url: str,
    schema: str,
    *,
    host: str = "127.0.0.1",
    users: str | None = None,
    broker: object = None,
    **app_options: Any,
) -> Iterator[Console]:
    """A console on its own port; ``app_options`` go to ``create_app``."""
    pool = ConnectionPool(database_url, min_size=1, max_size=4, open=True)
    server = serve(create_app(pool, schema, broker=broker, users=users, **app_options), host, 0)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        yield Console(f"http://127.0.0.1:{server.effective_port}", server)
    finally:
        server.close()
        pool.close()
