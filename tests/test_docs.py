"""The documentation stays true to the code: every setting is documented, the README's quickstart
is the example file and runs as written, and nothing cites a file the repository lacks."""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlparse

import psycopg
import pytest

from outbox.config import ENV_PREFIX, Settings

REPO = Path(__file__).resolve().parent.parent
QUICKSTART = REPO / "docs" / "examples" / "quickstart.py"
CONFIGURATION = REPO / "docs" / "configuration.md"


def env_var(field: dataclasses.Field) -> str:
    suffix = "_SECONDS" if field.type == "timedelta" else ""
    return f"{ENV_PREFIX}{field.name.upper()}{suffix}"


def documented_default(field: dataclasses.Field) -> str:
    value = field.default
    if value is None:
        return "—"
    if isinstance(value, timedelta):
        return str(int(value.total_seconds()))
    return str(value)


@pytest.mark.parametrize("field", dataclasses.fields(Settings), ids=lambda f: f.name)
def test_every_setting_has_a_row_with_its_variable_and_default(field):
    rows = {
        cells[0].strip("` "): [c.strip() for c in cells]
        for line in CONFIGURATION.read_text().splitlines()
        if line.startswith("| `")
        for cells in [line.strip("|").split("|")]
    }
    assert field.name in rows, f"docs/configuration.md lacks the setting {field.name}"
    _, variable, default, meaning = rows[field.name][:4]
    assert variable.strip("`") == env_var(field)
    assert default.strip("`").split(" ")[0] == documented_default(field)
    assert meaning


def python_blocks(markdown: str) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```$", markdown, flags=re.S | re.M)


def test_the_readme_quickstart_is_the_example_file_word_for_word():
    blocks = python_blocks((REPO / "README.md").read_text())
    assert QUICKSTART.read_text() in blocks


def with_search_path(url: str, schema: str) -> str:
    """The URL with the schema first on the search path (the example's own table goes there)."""
    parsed = urlparse(url)
    query = dict(parse_qsl(parsed.query))
    query["options"] = f"-csearch_path={schema}"
    return parsed._replace(query=urlencode(query)).geturl()


def test_the_quickstart_runs_as_written_and_posts_each_comment_once(database_url, schema):
    env = {
        **os.environ,
        "OUTBOX_DATABASE_URL": with_search_path(database_url, schema),
        "OUTBOX_SCHEMA": schema,
    }
    done = subprocess.run(
        [sys.executable, QUICKSTART.name],
        cwd=QUICKSTART.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "posted on issue 7: Feedback #1 received",
        "posted on issue 7: Feedback #2 received",
        "{'done': 2}",
    ]
    with psycopg.connect(database_url) as conn:
        actions = conn.execute(
            f'SELECT kind, state, lane_key FROM "{schema}".agent_action ORDER BY id'
        ).fetchall()
        feedback = conn.execute(f'SELECT count(*) FROM "{schema}".feedback').fetchone()[0]
    assert actions == [("ISSUE_COMMENT", "DONE", "issue:7")] * 2
    assert feedback == 2


#: Paths inside the repository as documents and comments write them.
_REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:outbox|tests|docs|migrations|benchmarks|scripts|workers|\.ci)/[\w/.*-]*\w"
    r"|[A-Z][A-Z_]*\.md|schema\.sql|LICENSE)\b"
)
_CITING = ("*.md", "*.py", "*.sql", "*.yml", "*.toml", "Makefile", "Dockerfile", ".ci/run")
_SKIP = {".venv", ".git", "__pycache__", ".pytest_cache", ".ruff_cache"}
#: Names that are not files of the checkout: where a built wheel carries migrations/.
_NOT_CHECKOUT_FILES = {"outbox/_migrations"}
#: Tests that write files of their own (fixture trees in tmp_path, this test's examples).
_WRITERS = {"tests/test_architecture.py", "tests/test_docs.py"}


def citing_files() -> list[Path]:
    found: set[Path] = set()
    for pattern in _CITING:
        for path in REPO.rglob(pattern):
            relative = path.relative_to(REPO)
            if _SKIP & set(relative.parts) or str(relative) in _WRITERS or not path.is_file():
                continue
            found.add(path)
    return sorted(found)


def cited_paths(text: str) -> set[str]:
    return {m.rstrip(".") for m in _REPO_PATH.findall(text)} - _NOT_CHECKOUT_FILES


def exists(cited: str, citing: Path) -> bool:
    for base in (REPO, citing.parent):
        if "*" in cited:
            if list(base.glob(cited)):
                return True
        elif (base / cited).exists():
            return True
    # A dotted module path in prose (outbox/dispatch/claimer) or a folder named without its file
    return (REPO / f"{cited}.py").exists()


def test_nothing_cites_a_file_the_repository_lacks():
    missing = [
        f"{path.relative_to(REPO)}: {cited}"
        for path in citing_files()
        for cited in cited_paths(path.read_text(errors="replace"))
        if not exists(cited, path)
    ]
    assert missing == []


def test_the_citation_check_catches_a_missing_file(tmp_path):
    citing = tmp_path / "note.md"
    assert cited_paths("see DESIGN.md and tests/test_trigger_pairs.py") == {
        "DESIGN.md",
        "tests/test_trigger_pairs.py",
    }
    assert not exists("DESIGN.md", citing)
    assert not exists("tests/test_trigger_pairs.py", citing)
    assert exists("tests/test_core_trigger.py", citing)
