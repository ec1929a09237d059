"""An install is reproducible: every dependency pyproject.toml names (the package's own and those
of each extra ``make install`` installs) is pinned in constraints.txt, which ``make install``
installs with, and the image's requirements-image.txt pins the runtime ones with hashes, at the
same versions. A dependency added or changed without re-locking fails here, saying to run
``make lock``."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
RELOCK = "run `make lock` and commit constraints.txt and requirements-image.txt"
#: A pin line of a uv / pip-tools lock: ``name==version`` (an environment marker may follow).
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)", re.MULTILINE)


def pins(path: Path) -> dict[str, str]:
    return {canonicalize_name(name): version for name, version in PIN.findall(path.read_text())}


def project() -> dict[str, object]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def install_extras() -> list[str]:
    """The extras of the editable install in the Makefile's install rule, which must install
    with the constraints file."""
    makefile = (REPO / "Makefile").read_text()
    (line,) = [line for line in makefile.splitlines() if "pip install" in line and " -e " in line]
    assert "-c constraints.txt" in line, f"`make install` does not install with the lock: {line}"
    match = re.search(r"-e '\.\[([\w,-]+)\]'", line)
    assert match, line
    return match.group(1).split(",")


def requirements(extras: list[str]) -> list[Requirement]:
    meta = project()
    named = list(meta["dependencies"])  # type: ignore[call-overload]
    optional: dict[str, list[str]] = meta["optional-dependencies"]  # type: ignore[assignment]
    for extra in extras:
        named += optional[extra]
    return [Requirement(text) for text in named]


def unpinned(required: list[Requirement], pinned: dict[str, str]) -> list[str]:
    problems = []
    for req in required:
        version = pinned.get(canonicalize_name(req.name))
        if version is None:
            problems.append(f"{req.name} is not pinned")
        elif not req.specifier.contains(version, prereleases=True):
            problems.append(f"{req.name}: pinned {version}, outside {req} of pyproject.toml")
    return problems


def test_every_dependency_make_install_installs_is_pinned_in_constraints_txt() -> None:
    extras = install_extras()
    assert "test" in extras
    problems = unpinned(requirements(extras), pins(REPO / "constraints.txt"))
    assert not problems, f"constraints.txt is behind pyproject.toml ({RELOCK}): " + "; ".join(
        problems
    )


def test_the_image_lock_pins_every_runtime_dependency_with_hashes_and_nothing_embedded() -> None:
    text = (REPO / "requirements-image.txt").read_text()
    pinned = pins(REPO / "requirements-image.txt")
    problems = unpinned(requirements(["celery"]), pinned)
    assert not problems, (
        f"requirements-image.txt is behind pyproject.toml ({RELOCK}): " + "; ".join(problems)
    )
    # Every pin carries the hashes of its files (pip --require-hashes in the Dockerfile).
    blocks = re.split(r"\n(?=[A-Za-z0-9])", text.split("\n", 2)[-1])
    for block in blocks:
        if PIN.match(block):
            assert "--hash=sha256:" in block, f"no hash: {block.splitlines()[0]}"
    for absent in ("pgserver", "pytest", "aiosmtpd", "mypy", "ruff"):
        assert absent not in pinned, f"{absent} in the image's lock"
    # The image runs the versions the tests ran.
    tested = pins(REPO / "constraints.txt")
    differing = {n: (v, tested.get(n)) for n, v in pinned.items() if tested.get(n) != v}
    assert not differing, f"the image's lock differs from constraints.txt ({RELOCK}): {differing}"


def test_a_dependency_added_without_relocking_is_named_with_the_command_to_run() -> None:
    required = [*requirements(install_extras()), Requirement("a-new-dependency>=1")]
    assert unpinned(required, pins(REPO / "constraints.txt")) == ["a-new-dependency is not pinned"]
    narrowed = [Requirement("psycopg>=99")]
    (problem,) = unpinned(narrowed, pins(REPO / "constraints.txt"))
    assert "outside psycopg>=99" in problem
