"""The console over plain HTTP: who may listen where, login and CSRF, hostile input, bulk
actions counted before they run, keyset paging, /healthz with the database down, /queues."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from datetime import timedelta

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from outbox import ActionRequest, enqueue
from outbox.console.auth import check_login, is_loopback, parse_users
from outbox.errors import ConfigurationError
from outbox.provider_outage import OutageRule
from tests.console_support import MESSAGE_ID, NOTE, populate, running_console
from tests.support import ScriptedAdapter


@pytest.fixture
def ids(make_outbox, database_url, schema):
    return populate(make_outbox, database_url, schema)


def csrf_of(client: httpx.Client, url: str) -> str:
    page = client.get(url).text
    return page.split('name="csrf_token" value="', 1)[1].split('"', 1)[0]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_the_command_refuses_a_wide_bind_without_a_login_in_one_line(host, database_url):
    env = {"PATH": "/usr/bin:/bin", "OUTBOX_DATABASE_URL": database_url}
    done = subprocess.run(
        [sys.executable, "-m", "outbox", "dashboard", "--host", host, "--port", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith("outbox dashboard: refusing to listen on")
    assert "OUTBOX_CONSOLE_USERS" in lines[0]


def test_a_container_published_on_loopback_listens_wide_without_a_login(database_url):
    """What docker-compose runs without OUTBOX_CONSOLE_USERS: the container's 0.0.0.0, which
    its port mapping publishes on the host's 127.0.0.1 only."""
    env = {"PATH": "/usr/bin:/bin", "OUTBOX_DATABASE_URL": database_url}
    argv = [sys.executable, "-m", "outbox", "dashboard", "--host", "0.0.0.0", "--port", "0"]
    process = subprocess.Popen(
        [*argv, "--published-on-loopback"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("outbox console on http://0.0.0.0:"), line
        port = int(line.rsplit(":", 1)[1].split("/", 1)[0])
        assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code in (200, 503)
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_loopback_names_are_loopback_and_wide_ones_are_not():
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("0.0.0.0") and not is_loopback("::") and not is_loopback("10.1.2.3")
    assert not is_loopback("no-such-host.invalid")


def test_users_parse_and_check_in_clear_and_hashed():
    from werkzeug.security import generate_password_hash

    users = parse_users(f"alice:s3cret, bob:{generate_password_hash('pw:with:colons')}")
    assert check_login(users, "alice", "s3cret") and not check_login(users, "alice", "s3cre")
    assert check_login(users, "bob", "pw:with:colons") and not check_login(users, "bob", "pw")
    assert not check_login(users, "carol", "s3cret")
    with pytest.raises(ConfigurationError, match="name:password"):
        parse_users("alice")


def test_without_a_login_nothing_is_shown_and_nothing_acts(ids, database_url, schema):
    with (
        running_console(database_url, schema, host="0.0.0.0", users="alice:s3cret") as c,
        httpx.Client(base_url=c.url) as client,
    ):
        for path in ("/", "/actions/", f"/actions/{ids['lost']}", "/uncertain/", "/queues/"):
            response = client.get(path)
            assert response.status_code == 302, path
            assert response.headers["location"].startswith("/login")
        token = csrf_of(client, "/login")
        refused = client.post(f"/actions/{ids['waiting']}/cancel", data={"csrf_token": token})
        assert refused.status_code == 401
        # A forged cookie (not signed with the console's key) logs nobody in.
        client.cookies.set("outbox_console", "eyJ1c2VyIjoiYWxpY2UifQ.forged.sig")
        assert client.get("/").status_code == 302
        assert client.get("/healthz").status_code == 200  # the probe needs no login
    assert _state(database_url, schema, ids["waiting"]) == "ADMITTED"


def test_a_post_without_the_sessions_csrf_token_changes_nothing(ids, database_url, schema):
    with running_console(database_url, schema) as c, httpx.Client(base_url=c.url) as client:
        assert client.post(f"/actions/{ids['waiting']}/cancel").status_code == 400
        other = httpx.Client(base_url=c.url)
        foreign = csrf_of(other, "/")
        response = client.post(f"/actions/{ids['waiting']}/cancel", data={"csrf_token": foreign})
        assert response.status_code == 400
        assert _state(database_url, schema, ids["waiting"]) == "ADMITTED"
        token = csrf_of(client, "/")
        done = client.post(f"/actions/{ids['waiting']}/cancel", data={"csrf_token": token})
        assert done.status_code == 302
        other.close()
    assert _state(database_url, schema, ids["waiting"]) == "CANCELLED"


def test_hostile_keys_are_shown_escaped(make_outbox, database_url, schema):
    populate(make_outbox, database_url, schema)
    evil = "<script>alert(1)</script>"
    with psycopg.connect(database_url, autocommit=True) as conn:
        enqueue(conn, ActionRequest(NOTE, evil, evil + "k", workspace_id="w"), schema=schema)
    with running_console(database_url, schema) as c, httpx.Client(base_url=c.url) as client:
        page = client.get("/actions/", params={"lane_key": evil}).text
        assert evil not in page and "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        response = client.get("/actions/")
        assert "script-src 'self'" in response.headers["content-security-policy"]
        # Bad filter values are ignored, not errors.
        assert client.get("/actions/?state=NOPE&since=yesterday&before=x").status_code == 200


def test_a_bulk_action_shows_the_count_first_and_acts_only_when_confirmed(
    make_outbox, database_url, schema
):
    populate(make_outbox, database_url, schema)
    with psycopg.connect(database_url, autocommit=True) as conn:
        for i in range(3):
            enqueue(conn, ActionRequest(NOTE, "bulk", f"bulk-{i}", workspace_id="w"), schema=schema)
    with running_console(database_url, schema) as c, httpx.Client(base_url=c.url) as client:
        token = csrf_of(client, "/actions/?lane_key=bulk")
        form = {"csrf_token": token, "lane_key": "bulk", "verb": "cancel"}
        confirm = client.post("/bulk", data=form)
        assert confirm.status_code == 200
        assert "<strong>3</strong> actions match" in confirm.text
        assert _states_in_lane(database_url, schema, "bulk") == {"ADMITTED": 3}
        done = client.post("/bulk", data={**form, "confirm": "yes"})
        assert done.status_code == 302
        assert "Cancel waiting: 3 of 3 done" in client.get(done.headers["location"]).text
    assert _states_in_lane(database_url, schema, "bulk") == {"CANCELLED": 3}


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(total=st.integers(0, 130), page_size=st.integers(1, 60))
def test_keyset_pages_cover_every_action_once_newest_first(
    make_outbox, database_url, schema, total, page_size
):
    from outbox.console.reads import ActionFilter, actions_page

    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
        ob = make_outbox()
        ob.register(NOTE, ScriptedAdapter())  # never run here
        ob.migrate()
        if total:
            from outbox import enqueue_many

            enqueue_many(
                conn,
                [ActionRequest(NOTE, f"l{i % 7}", f"k{i}", workspace_id="w") for i in range(total)],
                schema=schema,
            )
        seen: list[int] = []
        before = None
        while True:
            page = actions_page(conn, schema, ActionFilter(), before, limit=page_size)
            seen += [r["id"] for r in page.rows]
            if page.older is None:
                break
            before = page.older
        lane = actions_page(conn, schema, ActionFilter(lane_key="l3"), limit=1000).rows
    assert seen == sorted(seen, reverse=True) and len(seen) == len(set(seen)) == total
    assert len(lane) == len(range(3, total, 7))


def test_the_uncertain_list_shows_message_ids(ids, database_url, schema):
    with running_console(database_url, schema) as c, httpx.Client(base_url=c.url) as client:
        page = client.get("/uncertain/").text
    assert MESSAGE_ID.replace("<", "&lt;").replace(">", "&gt;") in page
    assert f'href="/actions/{ids["lost"]}"' in page


def test_healthz_answers_within_two_seconds_with_the_database_down_and_names_processes(
    tmp_path,
):
    from benchmarks.chaos.servers import PrivatePostgres, missing_binaries

    if missing_binaries():
        pytest.skip(missing_binaries())
    from outbox import Outbox

    with PrivatePostgres() as pg:
        Outbox(pg.url, schema="outbox").migrate()
        with psycopg.connect(pg.url, autocommit=True) as conn:
            conn.execute(
                "INSERT INTO outbox.outbox_process (process_id, role, host, pid, kinds, "
                "started_at) VALUES ('h:1:0', 'claimer', 'h', 1, '{}', now()), "
                "('h:2:0', 'worker', 'h', 2, '{NOTE}', now())"
            )
        with running_console(pg.url, "outbox") as c, httpx.Client(base_url=c.url) as client:
            up = client.get("/healthz").json()
            assert up["status"] == "ok" and up["claimers"] == 1 and up["workers"] == 1
            assert {p["role"] for p in up["processes"]} == {"claimer", "worker"}
            pg.stop()
            for _ in range(3):  # a pooled connection that died, then none to be had
                started = time.monotonic()
                down = client.get("/healthz", timeout=10)
                assert time.monotonic() - started < 2.0
                assert down.status_code == 503 and down.json()["status"] == "unavailable"
            page = client.get("/", timeout=30)
            assert page.status_code == 503 and "could not be read" in page.text
            pg.start()
            deadline = time.monotonic() + 30
            while client.get("/healthz", timeout=10).status_code != 200:
                assert time.monotonic() < deadline, "the console did not recover"
                time.sleep(0.5)


def test_the_broker_queues_are_mounted_and_link_back(ids, database_url, schema, redis_url):
    pytest.importorskip("dramatiq_dashboard")
    from outbox.dispatch.broker import broker_from_url

    broker = broker_from_url(redis_url)
    broker.declare_queue(NOTE.queue_name)
    with (
        running_console(database_url, schema, broker=broker) as c,
        httpx.Client(base_url=c.url) as client,
    ):
        page = client.get("/queues/").text
        assert "outbox.note" in page
        assert "The outbox's truth is PostgreSQL" in page and 'href="/"' in page
        assert 'href="/queues/"' in client.get("/").text


def _state(database_url: str, schema: str, action_id: int) -> str:
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            f'SELECT state FROM "{schema}".agent_action WHERE id = %s', (action_id,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def _states_in_lane(database_url: str, schema: str, lane: str) -> dict[str, int]:
    with psycopg.connect(database_url) as conn:
        rows = conn.execute(
            f'SELECT state, count(*) FROM "{schema}".agent_action WHERE lane_key = %s '
            "GROUP BY state",
            (lane,),
        ).fetchall()
    return {state: n for state, n in rows}


def test_blocked_lanes_say_why_each_is_blocked(make_outbox, database_url, schema):
    populate(make_outbox, database_url, schema)
    q = f'"{schema}".agent_action'
    with psycopg.connect(database_url, autocommit=True) as conn:
        ids = {
            key: enqueue(
                conn, ActionRequest(NOTE, key.split("-")[0], key, workspace_id="w"), schema=schema
            ).id
            for key in ("held-1", "held-2", "retry-1", "retry-2")
        }
        # A claim holds lane "held" (its lease runs); lane "retry"'s head came back for a retry.
        conn.execute(
            f"UPDATE {q} SET state = 'EXECUTING', epoch = epoch + 1, "
            "lease_until = now() + interval '5 minutes' WHERE id = %s",
            (ids["held-1"],),
        )
        conn.execute(
            f"UPDATE {q} SET state = 'EXECUTING', epoch = epoch + 1, attempt = attempt + 1, "
            "taken_epoch = epoch + 1, lease_until = now() + interval '5 minutes' WHERE id = %s",
            (ids["retry-1"],),
        )
        conn.execute(
            f"UPDATE {q} SET state = 'ADMITTED', lease_until = NULL, retry_reason = 'SMTP_421', "
            "available_at = now() + interval '10 minutes' WHERE id = %s",
            (ids["retry-1"],),
        )
        conn.execute(f'SELECT "{schema}".agent_action_lane_intake(1000)')
    with running_console(database_url, schema) as c, httpx.Client(base_url=c.url) as client:
        page = client.get("/lanes/").text
    held = page.split('lane_key=held"', 1)[1].split("</tr>", 1)[0]
    assert f"#{ids['held-2']}" in held and f"held by #{ids['held-1']}" in held
    assert "lease ends in 4m" in held
    retry = page.split('lane_key=retry"', 1)[1].split("</tr>", 1)[0]
    assert f"head #{ids['retry-1']} waits for its retry in" in retry
    assert "attempt 1 of 5, last reason SMTP_421" in retry


def test_live_processes_are_listed_and_silent_ones_are_not(ids, database_url, schema):
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(
            f'INSERT INTO "{schema}".outbox_process (process_id, role, host, pid, kinds, '
            "started_at, last_seen, in_flight) VALUES "
            "('a:11:0', 'claimer', 'host-a', 11, '{}', now(), now(), 0), "
            "('b:22:0', 'worker', 'host-b', 22, '{NOTE}', now(), now(), 7), "
            "('c:33:0', 'worker', 'host-c', 33, '{NOTE}', now(), now() - interval '1 hour', 0)"
        )
    with running_console(database_url, schema) as c, httpx.Client(base_url=c.url) as client:
        page = client.get("/processes/").text
        health = client.get("/healthz").json()
    assert "host-a" in page and "host-b" in page and "host-c" not in page
    assert '<td class="num">7</td>' in page
    assert health["claimers"] == 1 and health["workers"] == 1


def test_not_delivered_then_sent_again_links_both_ways(ids, database_url, schema):
    lost = ids["lost"]
    with running_console(database_url, schema) as c, httpx.Client(base_url=c.url) as client:
        token = csrf_of(client, f"/actions/{lost}")
        form = {"csrf_token": token, "outcome": "not-delivered", "note": "bounced"}
        assert client.post(f"/actions/{lost}/resolve", data=form).status_code == 302
        page = client.get(f"/actions/{lost}").text
        assert "Send it again" in page and "NOT_DELIVERED</strong> by" in page
        again = client.post(
            f"/actions/{lost}/resolve", data={"csrf_token": token, "outcome": "resend"}
        )
        assert again.status_code == 302
        page = client.get(f"/actions/{lost}").text
        new_id = int(page.split("resent as</dt><dd>", 1)[1].split("#", 1)[1].split("<", 1)[0])
        assert "Send it again" not in page
        # ...and the new action names the one it was resent from.
        new_page = client.get(f"/actions/{new_id}").text
        assert f'resend of</dt><dd><a href="/actions/{lost}">' in new_page
        # Resolving the other way now is refused, and says so.
        other = client.post(
            f"/actions/{lost}/resolve", data={"csrf_token": token, "outcome": "delivered"}
        )
        assert "Refused: " in client.get(other.headers["location"]).text
    assert _state(database_url, schema, new_id) == "ADMITTED"


def test_the_audit_names_who_did_what_from_the_console(ids, database_url, schema):
    with (
        running_console(database_url, schema, users="alice:s3cret") as c,
        httpx.Client(base_url=c.url) as client,
    ):
        token = csrf_of(client, "/login")
        login = {"csrf_token": token, "name": "alice", "password": "s3cret"}
        assert client.post("/login", data=login).status_code == 302
        token = csrf_of(client, "/")
        client.post(f"/actions/{ids['waiting']}/cancel", data={"csrf_token": token})
        audit = client.get("/audit/").text
        row = audit.split("<tbody>", 1)[1].split("</tr>", 1)[0]
        assert "alice" in row and "cancel" in row and f"#{ids['waiting']}" in row
        assert "alice" in client.get(f"/actions/{ids['waiting']}").text.split("Operator actions")[1]


def test_the_overview_names_what_holds_the_vacuum_horizon_until_it_ends(
    ids, database_url, schema, monkeypatch
):
    import outbox.status
    from outbox.vacuum_horizon import horizon_holders_operation

    # Holds over a fifth of a second count here, not only those over a minute.
    monkeypatch.setattr(
        outbox.status,
        "horizon_holders_operation",
        lambda schema: horizon_holders_operation(schema, timedelta(seconds=0.2), limit=50),
    )
    with (
        psycopg.connect(database_url, application_name="nightly report") as holder,
        running_console(database_url, schema) as c,
        httpx.Client(base_url=c.url) as client,
    ):
        # Other sessions of the database (other tests) may be listed too: only this one counts.
        named = f"session pid {holder.info.backend_pid} (role "
        assert named not in client.get("/").text
        holder.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        holder.execute("SELECT 1")
        time.sleep(0.5)
        page = client.get("/").text
        assert "Vacuum horizon held back" in page
        listed = page.split('data-region="vacuum-horizon"', 1)[1].split("</section>", 1)[0]
        assert named in listed
        assert re.search(r"&#39;nightly report&#39;, idle in transaction\) open for \d+s", listed)
        holder.rollback()
        assert named not in client.get("/").text


def test_the_overview_shows_a_kind_whose_provider_answers_retry(make_outbox, database_url, schema):
    from outbox import Retry
    from tests.email_support import run_one_round

    ob = make_outbox()
    ob.register(NOTE, ScriptedAdapter(lambda attempt: Retry(reason="PROVIDER_DOWN")))
    ob.migrate()
    with psycopg.connect(database_url) as conn:
        for i in range(2):
            request = ActionRequest(
                NOTE, lane_key=f"l{i}", idempotency_key=f"r{i}", workspace_id="w"
            )
            enqueue(conn, request, schema=schema)
        conn.commit()
    with running_console(database_url, schema) as c, httpx.Client(base_url=c.url) as client:
        assert "data-retrying" not in client.get("/").text
        run_one_round(ob)
        page = client.get("/").text
    row = page.split(f'data-kind="{NOTE.name}"', 1)[1].split("</tr>", 1)[0]
    assert 'data-retrying="2"' in row and "provider retrying: 2" in row
    assert 'data-outage="retrying"' in row and "from 5 (OUTBOX_OUTAGE_THRESHOLD)" in row
    # The console decides "down" with the executors' settings, as they do.
    with (
        running_console(database_url, schema, outage_rule=OutageRule(threshold=2)) as c,
        httpx.Client(base_url=c.url) as client,
    ):
        page = client.get("/").text
    row = page.split(f'data-kind="{NOTE.name}"', 1)[1].split("</tr>", 1)[0]
    assert 'data-outage="down"' in row and "provider down: 2" in row
    assert "from 2 (OUTBOX_OUTAGE_THRESHOLD)" in row
    assert "data-held" not in row and "End hold" not in row
    with psycopg.connect(database_url) as conn:
        conn.execute(
            f'UPDATE "{schema}".agent_action_kind_outage'
            " SET held_until = now() + interval '1 minute', holds = 1"
        )
    with running_console(database_url, schema) as c, httpx.Client(base_url=c.url) as client:
        page = client.get("/").text
    row = page.split(f'data-kind="{NOTE.name}"', 1)[1].split("</tr>", 1)[0]
    assert re.search(r'data-held="(59|60)"', row) and "End hold" in row
