"""The ``outbox`` command loads what its subcommand needs and no more: ``outbox health``, which a
container's healthcheck runs every few seconds, reads the health files without psycopg,
Dramatiq, Prometheus or an application (it took 0.7 s of CPU a probe when every command's
module was imported first). The subcommand registry names each command's module, so it must
say what each setup function really adds."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from outbox.cli import COMMANDS, _setup, build_parser

#: Modules a probe must not load: the database driver, the fabric, the metrics client, the
#: package's own heavy parts.
HEAVY = ("psycopg", "dramatiq", "prometheus_client", "outbox.outbox", "outbox.executor", "redis")


def _modules_after(code: str) -> set[str]:
    """The modules a fresh interpreter has loaded after running ``code``."""
    out = subprocess.run(
        [sys.executable, "-c", f"{code}\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return set(json.loads(out.splitlines()[-1]))


def test_the_health_probe_loads_no_driver_fabric_or_application(tmp_path: Path) -> None:
    loaded = _modules_after(
        "from outbox.cli import main\n"
        f"status = main(['health', '--role', 'worker', '--dir', {str(tmp_path)!r}])\n"
        "assert status == 1, status  # no worker process here"
    )
    heavy = sorted(m for m in loaded if m in HEAVY or m.split(".")[0] in HEAVY)
    assert heavy == []


def test_importing_outbox_loads_a_public_name_only_when_it_is_used() -> None:
    assert "psycopg" not in _modules_after("import outbox")
    loaded = _modules_after("from outbox import ActionRequest, Outbox")
    assert {"outbox.request", "outbox.outbox", "psycopg"} <= loaded


def test_every_public_name_of_the_package_resolves() -> None:
    import outbox

    for name in outbox.__all__:
        assert getattr(outbox, name) is not None, name
    assert set(dir(outbox)) >= set(outbox.__all__)


def test_the_registry_names_each_subcommand_with_the_setup_that_adds_it() -> None:
    for name, path in COMMANDS.items():
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        _setup(path)(sub)
        assert name in sub.choices, f"{path} does not add {name!r}"
        assert set(sub.choices) <= set(COMMANDS), f"{path} adds a command COMMANDS lacks"
    every = build_parser()._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    assert list(every) == list(COMMANDS), "outbox --help lists them in the registry's order"


def test_a_command_line_is_parsed_the_same_with_one_subcommand_or_all() -> None:
    lines = (
        ["health", "--role", "claimer", "--json"],
        ["-v", "status", "--latest", "3", "myapp:outbox"],
        ["worker", "myapp:outbox", "--processes", "2", "--debug"],
        ["retry", "--kind", "EMAIL", "--reason", "X", "--dry-run"],
    )
    for line in lines:
        alone = build_parser(line[0] if line[0] != "-v" else line[1]).parse_args(line)
        full = build_parser().parse_args(line)
        assert {k: v for k, v in vars(alone).items() if k != "func"} == {
            k: v for k, v in vars(full).items() if k != "func"
        }, line
        assert alone.func is full.func
