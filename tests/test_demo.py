"""The newcomer's path: the demo runs end to end, and docker-compose names commands that exist."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from outbox.cli import build_parser
from outbox.demo.run import render, run_demo
from outbox.loader import load_app

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_the_demo_ends_every_action_and_never_sends_twice(database_url, schema, monkeypatch):
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database_url)
    for name in ("OUTBOX_BROKER_URL", "OUTBOX_SMTP_URL"):
        monkeypatch.delenv(name, raising=False)
    result = run_demo(people=80, timeout=90, progress=False, schema=schema)
    assert result.enqueued > 60
    assert result.all_ended
    assert result.duplicates_at_sink == 0
    states = {state for state, _ in result.outcomes}
    assert {"DONE", "FAILED", "CANCELLED", "UNCERTAIN"} <= states
    # Every DONE and every UNCERTAIN email (timed out after DATA) reached the sink exactly once.
    reached = sum(
        n for (state, _), n in result.email_outcomes.items() if state in {"DONE", "UNCERTAIN"}
    )
    assert result.accepted_by_sink == reached
    # Beside the emails, webhooks and comments whose answers were lost: each taken once.
    assert result.webhooks_enqueued > 0 and result.comments_enqueued > 0
    assert result.webhooks_accepted == result.webhooks_enqueued
    assert result.webhook_bad_signatures == 0
    assert (result.comments_posted, result.comment_duplicates) == (result.comments_enqueued, 0)
    table = render(result)
    assert "outbox demo: outcomes" in table and "Where to look next" in table
    assert f"outbox status --schema {schema}" in table


def _compose_services() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]


def test_every_compose_service_runs_a_command_the_package_has(monkeypatch, database_url):
    subcommands = set(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
    services = _compose_services()
    assert {"postgres", "redis", "mailpit", "migrate", "claimer", "worker", "dashboard"} <= set(
        services
    )
    monkeypatch.setenv("OUTBOX_DATABASE_URL", database_url)
    monkeypatch.setenv("OUTBOX_SMTP_URL", "smtp://127.0.0.1:1025")
    monkeypatch.setenv("OUTBOX_SMTP_SENDER", "noreply@demo.example")
    for name, service in services.items():
        command = service.get("command")
        if not command or command[0] != "outbox":
            continue
        assert command[1] in subcommands, (name, command)
        build_parser().parse_args(command[1:])  # the arguments parse
        apps = [arg for arg in command[2:] if ":" in arg and not arg.startswith("-")]
        for app in apps:
            assert load_app(app).adapters, (name, app)
        assert "healthcheck" in service or name in {"migrate", "claimer", "worker", "demo"}


def test_docker_compose_accepts_the_file_where_the_plugin_exists():
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("no docker client")
    probe = subprocess.run([docker, "compose", "version"], capture_output=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip("the docker compose plugin is not installed")
    checked = subprocess.run(
        [docker, "compose", "-f", str(ROOT / "docker-compose.yml"), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert checked.returncode == 0, checked.stderr
