"""The wheel installs the ``outbox`` package only (no generic top-level ``workers``), carries
every file of migrations/ inside the package, and an installed ``outbox migrate`` applies those,
never a ``migrations/`` package that sits first on sys.path (another distribution's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent
DECOY_SQL = "CREATE TABLE decoy_was_applied (id int);\n"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
    )
    (built,) = out.glob("outbox-*.whl")
    return built


def test_the_wheel_holds_the_outbox_package_and_every_migration_inside_it(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    top_level = {name.split("/")[0] for name in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"outbox"}
    packaged = sorted(n.split("/")[-1] for n in names if n.startswith("outbox/_migrations/"))
    assert packaged == sorted(p.name for p in (REPO / "migrations").glob("*.sql"))


def test_the_wheel_marks_the_package_as_typed(wheel):
    # PEP 561: without outbox/py.typed a type checker ignores the package's annotations.
    assert "outbox/py.typed" in zipfile.ZipFile(wheel).namelist()


def test_installed_migrate_uses_the_packages_migrations_despite_a_decoy_first_on_sys_path(
    wheel, tmp_path, database_url, schema
):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), wheel],
        check=True,
        capture_output=True,
    )
    # Another distribution's top-level migrations/ package, installed next to the outbox.
    decoy = site / "migrations"
    decoy.mkdir()
    (decoy / "__init__.py").write_text("")
    (decoy / "0001_decoy.sql").write_text(DECOY_SQL)
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "OUTBOX_DATABASE_URL": database_url,
        "OUTBOX_SCHEMA": schema,
    }
    run = subprocess.run(
        [sys.executable, "-c", "import outbox, sys; print(outbox.__file__)"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=True,
    )
    assert run.stdout.strip().startswith(str(site))  # the installed wheel, not the checkout
    migrate = subprocess.run(
        [sys.executable, "-m", "outbox", "migrate", "--json"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
    )
    assert migrate.returncode == 0, migrate.stderr
    applied = json.loads(migrate.stdout)["applied"]
    assert applied == sorted(p.stem for p in (REPO / "migrations").glob("*.sql"))
    with psycopg.connect(database_url) as conn:
        tables = {
            r[0]
            for r in conn.execute(
                "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
                (schema,),
            )
        }
    assert "agent_action" in tables and "decoy_was_applied" not in tables
