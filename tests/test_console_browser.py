"""The console as a person uses it: headless Chromium (Debian's, driven by Playwright) clicks
through filtering, resolving, cancelling, pausing, logging in and typing during a refresh.
Screenshots land in tests/artifacts/ (git-ignored) for a person to look at."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.console_support import ARTIFACTS, MESSAGE_ID, populate, running_console
from tests.services import missing_service

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[object]:
    if CHROMIUM is None:
        missing_service("chromium not found on PATH (CI installs Debian's chromium package)")
    sync_api = pytest.importorskip("playwright.sync_api")
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(15_000)
    yield page
    context.close()


@pytest.fixture
def ids(make_outbox, database_url, schema):
    # Playwright's sync API keeps an event loop running in this thread; drain runs its own.
    with ThreadPoolExecutor(1) as thread:
        return thread.submit(populate, make_outbox, database_url, schema).result()


def shot(page, name: str) -> None:
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"console-{name}.png"), full_page=True)


def test_filter_to_uncertain_open_it_see_its_message_id_and_resolve_it(
    page, ids, database_url, schema
):
    with running_console(database_url, schema) as console:
        page.goto(console.url + "/actions/")
        page.select_option("select[name=state]", "UNCERTAIN")
        page.click("text=Filter")
        rows = page.locator("#results tbody tr")
        assert rows.count() == 1
        shot(page, "uncertain-filtered")
        page.click(f"#results a:text('#{ids['lost']}')")
        assert page.inner_text("#provider-ref") == MESSAGE_ID
        attempts = page.locator("table.attempts tbody tr")
        assert attempts.count() == 1
        assert "SMTP_DATA_TIMEOUT" in attempts.inner_text()
        assert MESSAGE_ID in attempts.inner_text()
        shot(page, "uncertain-action")
        page.check("input[name=outcome][value=delivered]")
        page.fill("input[name=note]", "relay log: 250 2.0.0 queued as 4F2A")
        page.click("text=Record the resolution")
        resolution = page.inner_text("#resolution")
        assert "DELIVERED" in resolution and "relay log: 250" in resolution
        assert "Resolved DELIVERED." in page.inner_text(".flash")
        shot(page, "uncertain-resolved")
    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            f'SELECT outcome, resolved_by FROM "{schema}".agent_action_resolution '
            "WHERE action_id = %s",
            (ids["lost"],),
        ).fetchone()
    assert row is not None and row[0] == "DELIVERED"


def test_cancel_a_waiting_action(page, ids, database_url, schema):
    with running_console(database_url, schema) as console:
        page.goto(f"{console.url}/actions/{ids['waiting']}")
        page.once("dialog", lambda dialog: dialog.accept())
        page.click("button:text('Cancel')")
        assert "Cancelled." in page.inner_text(".flash")
        assert "CANCELLED" in page.inner_text("h1")
        assert "OPERATOR_CANCELLED" in page.inner_text("dl.summary")
        shot(page, "cancelled")
    with psycopg.connect(database_url) as conn:
        state = conn.execute(
            f'SELECT state, stop_reason FROM "{schema}".agent_action WHERE id = %s',
            (ids["waiting"],),
        ).fetchone()
    assert state == ("CANCELLED", "OPERATOR_CANCELLED")


def test_pause_and_resume_a_kind(page, ids, database_url, schema):
    def paused() -> bool:
        with psycopg.connect(database_url) as conn:
            return bool(
                conn.execute(
                    f'SELECT 1 FROM "{schema}".agent_action_kind_pause WHERE kind = %s', ("NOTE",)
                ).fetchone()
            )

    with running_console(database_url, schema) as console:
        page.goto(console.url + "/")
        row = page.locator("tr[data-kind=NOTE]")
        page.once("dialog", lambda dialog: dialog.accept())
        row.locator("button:text('Pause')").click()
        assert "NOTE paused" in page.inner_text(".flash")
        assert "PAUSED" in page.locator("tr[data-kind=NOTE]").inner_text()
        assert paused()
        shot(page, "paused")
        page.locator("tr[data-kind=NOTE] button:text('Resume')").click()
        assert "NOTE resumed." in page.inner_text(".flash")
        assert "PAUSED" not in page.locator("tr[data-kind=NOTE]").inner_text()
        assert not paused()


def test_off_loopback_a_login_is_required_and_a_wrong_one_refused(page, ids, database_url, schema):
    with running_console(database_url, schema, host="0.0.0.0", users="alice:s3cret") as console:
        page.goto(f"{console.url}/actions/{ids['lost']}")
        assert page.url.startswith(console.url + "/login")
        assert "SMTP_DATA_TIMEOUT" not in page.content()
        page.fill("input[name=name]", "alice")
        page.fill("input[name=password]", "wrong")
        page.click("button:text('Log in')")
        assert "Wrong name or password." in page.inner_text("main")
        shot(page, "login-refused")
        page.fill("input[name=name]", "alice")
        page.fill("input[name=password]", "s3cret")
        page.click("button:text('Log in')")
        assert page.url == f"{console.url}/actions/{ids['lost']}"
        assert "alice" in page.inner_text("header")
        page.check("input[name=outcome][value=not-delivered]")
        page.click("text=Record the resolution")
        assert "by alice" in page.inner_text("#resolution")
        shot(page, "logged-in-resolved")


def test_typing_in_the_filter_box_survives_a_refresh(page, ids, database_url, schema):
    with running_console(database_url, schema) as console:
        page.goto(console.url + "/actions/")
        page.fill("input[name=reason]", "SMTP_RC")
        page.focus("input[name=reason]")
        with psycopg.connect(database_url, autocommit=True) as conn:
            from outbox import ActionRequest, enqueue

            late = enqueue(
                conn,
                ActionRequest("NOTE", "lane-late", "late-one", workspace_id="w"),
                schema=schema,
            )
        # The results region picks the new action up without a reload...
        page.wait_for_selector(f"#results a:text('#{late.id}')", timeout=20_000)
        # ...and what was typed is still there, with the focus.
        assert page.input_value("input[name=reason]") == "SMTP_RC"
        assert page.evaluate("document.activeElement.name") == "reason"
        assert "updated" in page.inner_text("#refreshed")
        shot(page, "refreshed-while-typing")
