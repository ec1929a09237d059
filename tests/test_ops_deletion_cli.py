"""``outbox prune`` and ``outbox erase`` through the real command: a dry run counts by kind and
state and deletes nothing; more than the threshold, or a prune shorter than the configured
retention, needs a confirmation (asked on a terminal, else ``--yes``, else a one-line refusal);
what they did is said in plain words."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest

from outbox import (
    ActionKind,
    ActionRequest,
    Cancelled,
    ConfigurationError,
    Done,
    Settings,
    Uncertain,
    enqueue,
)
from outbox.cli_deletion import duration_in_words
from outbox.testing import drain
from tests.support import ScriptedAdapter

ROOT = Path(__file__).resolve().parent.parent
NOTE = ActionKind("NOTE")
PING = ActionKind("PING")


def _ending(attempt):
    key = attempt.idempotency_key
    if "uncertain" in key:
        return Uncertain("TIMEOUT_AFTER_WRITE")
    if "cancel" in key:
        return Cancelled("NOT_WANTED")
    return Done("ok")


@pytest.fixture
def outbox(make_outbox):
    ob = make_outbox()
    ob.register(NOTE, ScriptedAdapter(_ending))
    ob.register(PING, ScriptedAdapter(_ending))
    ob.migrate()
    return ob


def _put(conn, schema, key, kind=NOTE, account=None, **fields):
    request = ActionRequest(
        kind,
        lane_key=f"lane-{key}",
        idempotency_key=key,
        workspace_id="w",
        subject_account_id=account,
        **fields,
    )
    return enqueue(conn, request, schema=schema).id


@pytest.fixture
def ended(outbox, database_url, schema):
    """Four actions that ended 40 days ago (NOTE: 2 DONE, 1 UNCERTAIN; PING: 1 CANCELLED), one
    that ended a day ago (DONE), one waiting (never pruned). Returns the ids by key."""
    keys = {"old-1": NOTE, "old-2": NOTE, "old-uncertain": NOTE, "old-cancel": PING, "new": NOTE}
    with psycopg.connect(database_url) as conn:
        ids = {key: _put(conn, schema, key, kind) for key, kind in keys.items()}
        conn.commit()
    drain(outbox)
    with psycopg.connect(database_url) as conn:
        ids["waiting"] = _put(conn, schema, "waiting", proposal=True)
        conn.commit()
        # The guard trigger refuses any change to an ended row: backdating runs without it.
        with conn.transaction():
            conn.execute("SET LOCAL session_replication_role = replica")
            conn.execute(
                f'UPDATE "{schema}".agent_action SET ended_at = now() - '
                "CASE WHEN idempotency_key = 'new' THEN interval '1 day' "
                "ELSE interval '40 days' END WHERE ended_at IS NOT NULL"
            )
    return ids


def _left(database_url, schema) -> list[str]:
    with psycopg.connect(database_url) as conn:
        found = conn.execute(
            f'SELECT idempotency_key FROM "{schema}".agent_action ORDER BY idempotency_key'
        ).fetchall()
    return [k for (k,) in found]


def outbox_cli(database_url, schema, *args, env=None, tty_answer=None):
    """Runs ``python -m outbox VERB --database-url ... --schema ... ARGS``: stdin a terminal
    that answers ``tty_answer``, or no input at all (as in cron or CI)."""
    command = [sys.executable, "-m", "outbox", args[0], "--database-url", database_url]
    command += ["--schema", schema, *args[1:]]
    environment = {name: v for name, v in os.environ.items() if name != "OUTBOX_CONFIRM_THRESHOLD"}
    environment.update(env or {})
    if tty_answer is None:
        return subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=environment,
            timeout=120,
        )
    controller, terminal = pty.openpty()
    try:
        os.write(controller, tty_answer.encode() + b"\n")
        return subprocess.run(
            command,
            stdin=terminal,
            capture_output=True,
            text=True,
            cwd=ROOT,
            env=environment,
            timeout=120,
        )
    finally:
        os.close(terminal)
        os.close(controller)


ALL_OLD_AND_NEW = ["new", "old-1", "old-2", "old-cancel", "old-uncertain", "waiting"]


def test_prune_dry_run_counts_by_kind_and_state_and_deletes_nothing(ended, database_url, schema):
    done = outbox_cli(database_url, schema, "prune", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "dry run: would prune 4 actions that ended more than 30 days ago; nothing deleted"
    )
    table = [line.split() for line in lines[1:]]
    assert table == [
        ["kind", "state", "actions"],
        ["NOTE", "DONE", "2"],
        ["NOTE", "UNCERTAIN", "1"],
        ["PING", "CANCELLED", "1"],
        ["total", "4"],
    ]
    as_json = outbox_cli(database_url, schema, "prune", "--dry-run", "--json", "--yes")
    assert json.loads(as_json.stdout) == {
        "dry_run": True,
        "would_prune": 4,
        "retention_seconds": 30 * 86400.0,
        "by_kind_and_state": [
            {"kind": "NOTE", "state": "DONE", "actions": 2},
            {"kind": "NOTE", "state": "UNCERTAIN", "actions": 1},
            {"kind": "PING", "state": "CANCELLED", "actions": 1},
        ],
    }
    assert _left(database_url, schema) == ALL_OLD_AND_NEW


def test_prune_over_the_threshold_refuses_without_a_terminal_and_goes_on_with_yes(
    ended, database_url, schema
):
    refused = outbox_cli(database_url, schema, "prune", "--confirm-threshold", "3")
    assert refused.returncode == 2
    assert refused.stdout == ""
    assert refused.stderr.splitlines() == [
        "outbox prune: it would delete 4 actions, more than the confirmation threshold "
        "(3, OUTBOX_CONFIRM_THRESHOLD): pass --yes to prune them (--dry-run lists them by kind "
        "and state)"
    ]
    assert _left(database_url, schema) == ALL_OLD_AND_NEW
    # The setting is the default threshold; the flag overrides it.
    by_setting = outbox_cli(database_url, schema, "prune", env={"OUTBOX_CONFIRM_THRESHOLD": "3"})
    assert by_setting.returncode == 2 and "threshold (3," in by_setting.stderr
    assert outbox_cli(database_url, schema, "prune", "--dry-run").returncode == 0
    confirmed = outbox_cli(database_url, schema, "prune", "--confirm-threshold", "3", "--yes")
    assert confirmed.returncode == 0, confirmed.stderr
    assert confirmed.stdout == "pruned 4 actions that ended more than 30 days ago\n"
    assert _left(database_url, schema) == ["new", "waiting"]


def test_under_the_threshold_the_configured_retention_prunes_without_asking(
    ended, database_url, schema
):
    done = outbox_cli(database_url, schema, "prune", "--confirm-threshold", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pruned 4 actions that ended more than 30 days ago\n"
    again = outbox_cli(database_url, schema, "prune")
    assert again.stdout == "pruned nothing: no action ended more than 30 days ago\n"


def test_a_retention_shorter_than_configured_names_the_uncertain_actions_and_needs_yes(
    ended, database_url, schema
):
    refused = outbox_cli(database_url, schema, "prune", "--retention-days", "0")
    assert refused.returncode == 2
    (line,) = refused.stderr.splitlines()
    assert line == (
        "outbox prune: the retention (0 seconds) is shorter than the configured 30 days, and it "
        "would delete 1 unresolved UNCERTAIN actions: pass --yes to prune them (--dry-run lists "
        "them by kind and state)"
    )
    assert _left(database_url, schema) == ALL_OLD_AND_NEW
    done = outbox_cli(database_url, schema, "prune", "--retention-days", "0", "--yes")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "pruned 5 actions that had ended (retention 0: every ended action)\n"
    assert "0:00:00" not in done.stdout
    assert _left(database_url, schema) == ["waiting"]


def test_on_a_terminal_prune_asks_and_only_a_yes_deletes(ended, database_url, schema):
    declined = outbox_cli(database_url, schema, "prune", "--retention-days", "2", tty_answer="n")
    assert declined.returncode == 1
    assert "Prune these 4 actions? [y/N]" in declined.stderr
    assert "1 unresolved UNCERTAIN actions" in declined.stderr
    assert ["NOTE", "UNCERTAIN", "1"] in [line.split() for line in declined.stderr.splitlines()]
    assert declined.stderr.rstrip().endswith("outbox prune: nothing deleted (not confirmed)")
    assert _left(database_url, schema) == ALL_OLD_AND_NEW
    accepted = outbox_cli(database_url, schema, "prune", "--retention-days", "2", tty_answer="yes")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == "pruned 4 actions that ended more than 2 days ago\n"
    assert _left(database_url, schema) == ["new", "waiting"]


@pytest.fixture
def subject(outbox, database_url, schema):
    """Three actions of account acc-1 (two NOTE waiting, one PING proposed), one of acc-2."""
    with psycopg.connect(database_url) as conn:
        _put(conn, schema, "a1", account="acc-1")
        _put(conn, schema, "a2", account="acc-1")
        _put(conn, schema, "a3", PING, account="acc-1", proposal=True)
        _put(conn, schema, "b1", account="acc-2")
        conn.commit()


def test_erase_dry_run_counts_and_deletes_nothing(subject, database_url, schema):
    done = outbox_cli(database_url, schema, "erase", "--account", "acc-1", "--dry-run")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == (
        "dry run: would erase 3 actions whose subject is the account; nothing deleted"
    )
    assert [line.split() for line in lines[2:4]] == [
        ["NOTE", "ADMITTED", "2"],
        ["PING", "PROPOSED", "1"],
    ]
    as_json = outbox_cli(database_url, schema, "erase", "--account", "acc-1", "--dry-run", "--json")
    assert json.loads(as_json.stdout)["would_erase"] == 3
    assert _left(database_url, schema) == ["a1", "a2", "a3", "b1"]


def test_erase_over_the_threshold_asks_refuses_or_goes_on(subject, database_url, schema):
    args = ("erase", "--account", "acc-1", "--confirm-threshold", "2")
    refused = outbox_cli(database_url, schema, *args)
    assert refused.returncode == 2
    assert refused.stderr.splitlines() == [
        "outbox erase: it would erase 3 actions, more than the confirmation threshold (2, "
        "OUTBOX_CONFIRM_THRESHOLD): pass --yes to erase them (--dry-run lists them by kind and "
        "state)"
    ]
    declined = outbox_cli(database_url, schema, *args, tty_answer="")
    assert declined.returncode == 1 and "Erase these 3 actions? [y/N]" in declined.stderr
    assert _left(database_url, schema) == ["a1", "a2", "a3", "b1"]
    accepted = outbox_cli(database_url, schema, *args, tty_answer="y")
    assert accepted.returncode == 0, accepted.stderr
    assert accepted.stdout == (
        "erased 3 actions whose subject is the account (2 ADMITTED, 1 PROPOSED)\n"
    )
    assert _left(database_url, schema) == ["b1"]
    nothing = outbox_cli(database_url, schema, "erase", "--account", "acc-1")
    assert nothing.stdout == "erased nothing: no action has the account as its subject\n"


def test_durations_read_as_words():
    assert duration_in_words(timedelta(days=30)) == "30 days"
    assert duration_in_words(timedelta(days=1)) == "1 day"
    assert duration_in_words(timedelta(days=0.5)) == "12 hours"
    assert duration_in_words(timedelta(minutes=90)) == "90 minutes"
    assert duration_in_words(timedelta(seconds=1)) == "1 second"
    assert duration_in_words(timedelta(seconds=1.5)) == "1.5 seconds"
    assert duration_in_words(timedelta(0)) == "0 seconds"


def test_a_negative_threshold_is_a_configuration_error():
    with pytest.raises(ConfigurationError, match="OUTBOX_CONFIRM_THRESHOLD"):
        Settings.from_env({"OUTBOX_CONFIRM_THRESHOLD": "-1"})
