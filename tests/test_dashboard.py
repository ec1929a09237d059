"""The dashboard as a person sees it: headless Chromium renders the pages, the test reads them."""

from __future__ import annotations

import shutil
import subprocess
import threading
from collections.abc import Iterator

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from outbox import ActionKind, ActionRequest, Done, Failed, Uncertain, enqueue
from outbox.dashboard import DashboardApp, serve
from outbox.testing import drain
from tests.services import missing_service
from tests.support import ScriptedAdapter

NOTE = ActionKind("NOTE")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def render(url: str) -> str:
    """The DOM after Chromium loaded ``url`` (what a person's browser would show)."""
    if CHROMIUM is None:
        missing_service("chromium not found on PATH (CI installs Debian's chromium package)")
    completed = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--user-data-dir=/tmp/outbox-dashboard-test-profile",
            "--dump-dom",
            url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert completed.returncode == 0, completed.stderr[-2000:]
    return completed.stdout


@pytest.fixture
def populated(make_outbox, database_url, schema):
    script = {
        "ok": Done("250 queued"),
        "refused": Failed("SMTP_RCPT_550"),
        "lost": Uncertain("SMTP_DATA_TIMEOUT"),
    }
    ob = make_outbox()
    ob.register(NOTE, ScriptedAdapter(lambda a: script[a.payload["what"]]))
    ob.migrate()
    ids = {}
    with psycopg.connect(database_url) as conn:
        for what in ("ok", "ok", "refused", "lost"):
            action = enqueue(
                conn,
                ActionRequest(
                    NOTE, f"lane-{what}", f"{what}-{len(ids)}", {"what": what}, workspace_id="w"
                ),
                schema=schema,
            )
            ids[what] = action.id
        conn.commit()
    drain(ob)
    with psycopg.connect(database_url) as conn:
        waiting = enqueue(
            conn, ActionRequest(NOTE, "lane-wait", "waiting", workspace_id="w"), schema=schema
        )
        conn.commit()
    ids["waiting"] = waiting.id
    return ids


@pytest.fixture
def dashboard(database_url, schema, redis_url) -> Iterator[str]:
    from outbox.dispatch.broker import broker_from_url

    broker = broker_from_url(redis_url)
    broker.declare_queue(NOTE.queue_name)
    pool = ConnectionPool(database_url, min_size=1, max_size=2, open=True)
    server = serve(DashboardApp(pool, schema, broker), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}"
    server.shutdown()
    server.server_close()
    pool.close()


def test_the_overview_shows_counts_backlog_and_the_latest_problems(populated, dashboard):
    page = render(dashboard + "/")
    assert "Actions by kind and state" in page
    assert "NOTE" in page and "outbox.note" in page
    assert "SMTP_DATA_TIMEOUT" in page and "SMTP_RCPT_550" in page
    assert f'href="/actions/{populated["lost"]}"' in page
    assert f'href="/actions/{populated["refused"]}"' in page
    # Counts by state: two DONE, one FAILED, one UNCERTAIN, one waiting.
    row = page.split("<td>NOTE</td>", 1)[1].split("</tr>", 1)[0]
    cells = [c.split(">", 1)[1].split("<", 1)[0] for c in row.split("<td")[1:]]
    assert cells == ["0", "1", "0", "2", "1", "1", "0"]


def test_an_actions_page_shows_its_fields_and_history(populated, dashboard):
    page = render(f"{dashboard}/actions/{populated['lost']}")
    assert f"Action #{populated['lost']}" in page
    assert "UNCERTAIN" in page and "SMTP_DATA_TIMEOUT" in page
    assert "History" in page and "ended" in page and "write_started" in page


def test_an_unknown_action_says_so(populated, dashboard):
    assert "No such action" in render(f"{dashboard}/actions/999999999")


def test_the_broker_queues_are_mounted_from_dramatiq_dashboard(populated, dashboard):
    pytest.importorskip("dramatiq_dashboard")
    page = render(dashboard + "/queues/")
    assert "outbox.note" in page
