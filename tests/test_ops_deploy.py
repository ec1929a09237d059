"""What the Dockerfile and docker-compose.yml promise, read from the files themselves (no Docker
needed): the image installs its locked dependencies in a layer before the source, no embedded
PostgreSQL, runs as a user of its own and checks its process's health; in compose, every image is
pinned, every long-running service has a healthcheck (the claimer's and the worker pool's are
``outbox health``), the demo runs in a schema of its own, and nothing is published beyond this
host unless a password is set. The compose checks are generic: a service added later is held to
the same rules."""

from __future__ import annotations

import re
import shlex
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from outbox.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
LOOPBACK = ("127.0.0.1", "::1", "localhost")


# -- the Dockerfile ----------------------------------------------------------------------------


def instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` in order, continuation lines joined, comments dropped."""
    joined: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        joined.append(pending + line)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in joined]


@pytest.fixture(scope="module")
def dockerfile() -> list[tuple[str, str]]:
    return instructions(REPO / "Dockerfile")


def test_the_base_image_is_pinned_to_a_patch_release(dockerfile: list[tuple[str, str]]) -> None:
    (base,) = [args for op, args in dockerfile if op == "FROM"]
    assert re.search(r":\d+\.\d+\.\d+", base), f"unpinned base image: {base}"


def test_dependencies_are_installed_from_the_hashed_lock_before_the_source_is_copied(
    dockerfile: list[tuple[str, str]],
) -> None:
    copies = [(i, args) for i, (op, args) in enumerate(dockerfile) if op in ("COPY", "ADD")]
    (lock_install,) = [
        i
        for i, (op, args) in enumerate(dockerfile)
        if op == "RUN" and "-r requirements-image.txt" in args
    ]
    assert "--require-hashes" in dockerfile[lock_install][1]
    source = min(i for i, args in copies if re.search(r"\boutbox\b", args.split()[0]))
    assert lock_install < source, "the dependencies are installed after the source is copied"
    before = [args for i, args in copies if i < lock_install]
    assert before == ["requirements-image.txt ./"], (
        f"copied before the dependency layer (any change to these rebuilds it): {before}"
    )
    # The outbox itself is installed without touching the dependency layer.
    after = [args for op, args in dockerfile[source:] if op == "RUN" and "pip install" in args]
    assert after and all("--no-deps" in args for args in after), after


def test_the_image_holds_no_embedded_postgres_and_runs_as_a_user_of_its_own(
    dockerfile: list[tuple[str, str]],
) -> None:
    for op, args in dockerfile:
        assert "pgserver" not in args and "embedded" not in args, f"{op} {args}"
    users = [args.strip() for op, args in dockerfile if op == "USER"]
    assert users and users[-1] not in ("root", "0", "0:0"), users
    last_user = max(i for i, (op, _) in enumerate(dockerfile) if op == "USER")
    runs_after = [args for op, args in dockerfile[last_user:] if op == "RUN"]
    assert not runs_after, "RUN after USER: the image's last user must be the one it runs as"
    assert any(op == "RUN" and "useradd" in args for op, args in dockerfile)


def test_the_image_checks_the_health_of_its_process(dockerfile: list[tuple[str, str]]) -> None:
    (check,) = [args for op, args in dockerfile if op == "HEALTHCHECK"]
    assert '"outbox", "health"' in check, check
    env = " ".join(args for op, args in dockerfile if op == "ENV")
    assert "OUTBOX_HEALTH_DIR=" in env


def test_every_file_the_image_copies_passes_the_dockerignore(
    dockerfile: list[tuple[str, str]],
) -> None:
    allowed = [
        line[1:].rstrip("/")
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    for op, args in dockerfile:
        if op == "COPY":
            for source in args.split()[:-1]:
                assert source in allowed, f"{source} is not sent to the builder (.dockerignore)"


# -- docker-compose.yml --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    return dict(compose["services"])


def defaults(text: str) -> str:
    """``text`` as compose interpolates it with nothing set: ``${X:-d}`` is d, ``${X}`` empty."""
    text = re.sub(r"\$\{[A-Za-z_]\w*:?-([^}]*)\}", r"\1", text)
    return re.sub(r"\$\{[^}]*\}", "", text)


def command_of(service: dict[str, Any]) -> str:
    command = service.get("command", "")
    return " ".join(command) if isinstance(command, list) else str(command)


def one_shot(service: dict[str, Any]) -> bool:
    return service.get("restart") == "no"


def test_every_image_is_pinned_to_a_version(services: dict[str, dict[str, Any]]) -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    for name, service in services.items():
        image = service.get("image")
        if image is None:
            assert "build" in service, f"{name}: neither an image nor a build"
            continue
        tag = image.rsplit("/", 1)[-1].partition(":")[2]
        assert tag and tag != "latest" and re.search(r"\d", tag), f"{name}: unpinned {image}"
        if "build" in service and image.startswith("outbox:"):
            assert tag == version, f"{name}: built as {image}, the version is {version}"


def test_every_long_running_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        check = service.get("healthcheck") or {}
        if one_shot(service):
            continue
        assert check.get("test") and not check.get("disable"), f"{name}: no healthcheck"


@pytest.mark.parametrize("role", ["claimer", "worker"])
def test_claimers_and_worker_pools_are_checked_by_their_role_probe(
    services: dict[str, dict[str, Any]], role: str
) -> None:
    running = [
        (name, s) for name, s in services.items() if re.search(rf"\boutbox {role}\b", command_of(s))
    ]
    assert running, f"no {role} service"
    for name, service in running:
        test = service["healthcheck"]["test"]
        probe = " ".join(test) if isinstance(test, list) else test
        assert f"outbox health --role {role}" in probe, f"{name}: {probe}"
        assert "--live" not in probe, f"{name}: readiness is what compose should wait for"
        build_parser().parse_args(shlex.split(probe)[2:])  # CMD outbox health ...: it parses


def test_nothing_is_published_beyond_this_host_by_default(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        for port in service.get("ports", []):
            if isinstance(port, dict):
                host = defaults(str(port.get("host_ip", "")))
            else:
                parts = defaults(str(port)).split(":")
                host = parts[0] if len(parts) == 3 else ""
            assert host in LOOPBACK, f"{name}: {port} is published on every interface"


def test_the_dashboard_is_published_beyond_this_host_only_with_a_login(
    services: dict[str, dict[str, Any]],
) -> None:
    (name,) = [
        n for n, s in services.items() if re.search(r"outbox (dashboard|console)\b", command_of(s))
    ]
    service = services[name]
    (port,) = service["ports"]
    assert "${OUTBOX_CONSOLE_ADDRESS:-127.0.0.1}:" in port
    assert service["environment"]["OUTBOX_CONSOLE_USERS"] == "${OUTBOX_CONSOLE_USERS:-}"
    sh, flag, script = service["command"]
    assert (sh, flag) == ("sh", "-c")
    # As compose runs it ($$ is a literal $), with the server's start replaced by an echo.
    script = script.replace("$$", "$").replace("exec outbox", "exec echo outbox")

    def start(address: str, users: str) -> subprocess.CompletedProcess[str]:
        env = {"OUTBOX_CONSOLE_ADDRESS": address, "OUTBOX_CONSOLE_USERS": users}
        return subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True)

    # Without a login: on the host's loopback only, and the console is told so.
    started = start("127.0.0.1", "").stdout
    assert started.startswith("outbox dashboard")
    assert build_parser().parse_args(shlex.split(started)[1:]).published_on_loopback
    refused = start("0.0.0.0", "")
    assert refused.returncode == 2 and "OUTBOX_CONSOLE_USERS" in refused.stderr
    # With a login, anywhere, and the console's own check applies.
    for address in ("0.0.0.0", "127.0.0.1"):
        with_login = start(address, "ops:s3cret").stdout
        assert with_login.startswith("outbox dashboard")
        assert not build_parser().parse_args(shlex.split(with_login)[1:]).published_on_loopback


def test_the_demo_runs_in_a_schema_no_long_running_service_uses(
    services: dict[str, dict[str, Any]],
) -> None:
    def schema(service: dict[str, Any]) -> str:
        return str(service.get("environment", {}).get("OUTBOX_SCHEMA", "outbox"))

    demos = [s for s in services.values() if shlex.split(command_of(s))[:2] == ["outbox", "demo"]]
    assert demos, "no demo service"
    shared = {schema(s) for s in services.values() if not one_shot(s) and s.get("build")}
    for demo in demos:
        assert one_shot(demo) and "demo" in demo.get("profiles", [])
        assert schema(demo) not in shared, f"the demo would drop {schema(demo)}, in use by others"


def test_claimers_and_workers_keep_health_files(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if re.search(r"\boutbox (claimer|worker)\b", command_of(service)):
            assert service["environment"].get("OUTBOX_HEALTH_DIR"), name
