"""The ``outbox`` command as an operator meets it: every everyday mistake (no database URL,
an unreachable or malformed database, an unmigrated schema, a malformed broker URL, a bad
number) is one line on stderr naming what to fix and a documented exit status, never a
traceback; errors name the variable the user set; ``python -m outbox`` and ``--version`` work."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import fields
from importlib import metadata
from pathlib import Path

import pytest

from outbox.cli import main
from outbox.config import Settings, env_name
from outbox.errors import ConfigurationError

REPO = str(Path(__file__).resolve().parent.parent)
APP = "tests.apps.dispatch_app:make_outbox"
#: Subcommands that read the database before doing anything (with what each needs besides).
DATABASE_COMMANDS = {
    "migrate": [],
    "prune": [],
    "erase": ["--account", "a1"],
    "status": [],
    "inspect": ["1"],
}
#: Every subcommand that needs a database URL (demo brings its own embedded database).
NEEDS_DATABASE = {**DATABASE_COMMANDS, "dashboard": [], "claimer": [APP], "worker": [APP]}


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def clean_env(monkeypatch):
    # `outbox claimer` and `outbox worker` hand their options to the processes they become
    # through os.environ: run in-process here, they must not leak into later tests.
    saved = dict(os.environ)
    for name in ("OUTBOX_DATABASE_URL", "DATABASE_URL", "OUTBOX_SCHEMA", "OUTBOX_BROKER_URL"):
        # Set first, so that teardown also removes what a command wrote to os.environ itself
        # (`outbox claimer` and `worker` pass their options to the processes they start there).
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    monkeypatch.delenv("OUTBOX_DEBUG", raising=False)
    monkeypatch.setenv("DISPATCH_APP_SUFFIX", "CLI")
    yield monkeypatch
    os.environ.clear()
    os.environ.update(saved)


def run_main(argv: list[str], capsys) -> tuple[int, str]:
    """Exit status and stderr of ``outbox ARGV`` (argparse's usage errors included)."""
    try:
        status = main(argv)
    except SystemExit as exit_:  # argparse: usage errors exit 2
        status = int(exit_.code or 0)
    return status, capsys.readouterr().err


def assert_one_line(err: str, command: str, *needles: str) -> None:
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"outbox {command}: "), err
    for needle in needles:
        assert needle in lines[0], err


@pytest.mark.parametrize("command", sorted(NEEDS_DATABASE))
def test_no_database_url_is_one_line_and_exit_2(command, clean_env, capsys):
    if command in ("claimer", "worker"):
        # The test app reads OUTBOX_DATABASE_URL itself; this names no database at all.
        clean_env.setattr("tests.apps.dispatch_app.make_outbox", _app_without_database)
    status, err = run_main([command, *NEEDS_DATABASE[command]], capsys)
    assert status == 2
    assert_one_line(err, command, "OUTBOX_DATABASE_URL", "--database-url")


def _app_without_database():
    from outbox import Outbox

    return Outbox()


@pytest.mark.parametrize("command", sorted(DATABASE_COMMANDS))
def test_unreachable_database_is_one_line_and_exit_1(command, clean_env, capsys):
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/test"
    status, err = run_main([command, *DATABASE_COMMANDS[command], "--database-url", url], capsys)
    assert status == 1
    assert_one_line(err, command, "PostgreSQL unreachable", "Connection refused")


@pytest.mark.parametrize("command", sorted(set(DATABASE_COMMANDS) - {"migrate"}))
def test_unmigrated_schema_is_one_line_naming_migrate_and_exit_1(
    command, database_url, schema, clean_env, capsys
):
    argv = [command, *DATABASE_COMMANDS[command], "--database-url", database_url]
    status, err = run_main([*argv, "--schema", schema], capsys)
    assert status == 1
    assert_one_line(err, command, "not migrated", "outbox migrate", schema)


@pytest.mark.parametrize("command", sorted(NEEDS_DATABASE))
@pytest.mark.parametrize(
    ("url", "needle"),
    [("notaurl", "not a PostgreSQL URL"), ("postgresql://u:secret@h:abc/db", "port 'abc'")],
)
def test_malformed_database_url_is_one_line_without_the_url_and_exit_2(
    command, url, needle, clean_env, capsys
):
    clean_env.setenv("OUTBOX_DATABASE_URL", url)
    clean_env.setenv("OUTBOX_SCHEMA", "cli_unused")  # the test app reads it itself
    status, err = run_main([command, *NEEDS_DATABASE[command]], capsys)
    assert status == 2
    assert_one_line(err, command, "OUTBOX_DATABASE_URL", needle)
    assert "secret" not in err


@pytest.mark.parametrize("command", ["claimer", "worker", "dashboard"])
@pytest.mark.parametrize(
    ("url", "needle"),
    [("http://h:6379", "scheme must be redis://"), ("redis://h:port/0", "port is not a number")],
)
def test_malformed_broker_url_is_one_line_and_exit_2(
    command, url, needle, database_url, schema, clean_env, capsys
):
    clean_env.setenv("OUTBOX_DATABASE_URL", database_url)
    clean_env.setenv("OUTBOX_SCHEMA", schema)
    argv = [command, *NEEDS_DATABASE[command], "--broker-url", url]
    if command == "dashboard":  # no --broker-url option: the environment's
        argv = [command]
        clean_env.setenv("OUTBOX_BROKER_URL", url)
    status, err = run_main(argv, capsys)
    assert status == 2
    assert_one_line(err, command, "OUTBOX_BROKER_URL", needle)


@pytest.mark.parametrize(
    "argv",
    [
        ["status", "--latest", "-1"],
        ["status", "--latest", "many"],
        ["prune", "--retention-days", "-3"],
        ["prune", "--batch-size", "0"],
        ["inspect", "x"],
        ["worker", APP, "--processes", "0"],
        ["worker", APP, "-t", "two"],
        ["demo", "--people", "0"],
        ["dashboard", "--port", "70000"],
    ],
)
def test_a_bad_number_is_a_usage_error_naming_the_option(argv, clean_env, capsys):
    status, err = run_main(argv, capsys)
    assert status == 2
    assert "Traceback" not in err
    assert f"outbox {argv[0]}: error: argument" in err


@pytest.mark.parametrize(
    "field", [f.name for f in fields(Settings) if f.type in ("int", "timedelta")]
)
def test_a_non_numeric_setting_names_the_variable_the_user_set(field, clean_env, capsys):
    variable = env_name(field)
    with pytest.raises(ConfigurationError, match=rf"^{variable}: 'abc'"):
        Settings.from_env({variable: "abc"})
    clean_env.setenv(variable, "abc")
    status, err = run_main(["status"], capsys)
    assert status == 2
    assert_one_line(err, "status", f"{variable}: 'abc'")


def test_lease_seconds_is_named_as_set():
    with pytest.raises(ConfigurationError, match=r"^OUTBOX_LEASE_SECONDS: 'abc'"):
        Settings.from_env({"OUTBOX_LEASE_SECONDS": "abc"})


def test_debug_prints_the_traceback_and_the_line(clean_env, capsys):
    url = f"postgresql://postgres@127.0.0.1:{closed_port()}/test"
    status, err = run_main(["status", "--database-url", url, "--debug"], capsys)
    assert status == 1
    assert "Traceback" in err and err.strip().splitlines()[-1].startswith("outbox status: ")
    clean_env.setenv("OUTBOX_DEBUG", "1")
    status, err = run_main(["--verbose", "status", "--database-url", url], capsys)
    assert status == 1 and "Traceback" in err


def test_python_dash_m_outbox_is_the_command_and_version_comes_from_the_metadata():
    version = subprocess.run(
        [sys.executable, "-m", "outbox", "--version"], capture_output=True, text=True, cwd=REPO
    )
    assert version.returncode == 0
    assert version.stdout.strip() == f"outbox {metadata.version('outbox')}"
    env = {"PATH": "/usr/bin:/bin", "OUTBOX_LEASE_SECONDS": "abc"}
    failed = subprocess.run(
        [sys.executable, "-m", "outbox", "status"], capture_output=True, text=True, env=env
    )
    assert failed.returncode == 2
    assert (
        failed.stderr.strip()
        == "outbox status: OUTBOX_LEASE_SECONDS: 'abc' is not a number of seconds"
    )
