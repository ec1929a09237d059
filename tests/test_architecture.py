"""Architecture rules as tests, each shown to catch a deliberate violation.

1. Only ``outbox/executor.py`` calls an adapter's ``execute`` (read from the AST of every module
   under ``outbox/`` and ``workers/``).
2. Only ``outbox/email/`` imports aiosmtplib (the one code that speaks SMTP).
3. Only the HTTP kinds' packages (``outbox/webhook/``, ``outbox/issue_comment/``,
   ``outbox/chat_reply/``) import httpx: each kind has the one adapter that speaks its protocol.
4. No adapter runs while a database transaction is open: the executor refuses at run time when
   its task holds an outbox connection, and a real drain shows every pool connection idle while
   each adapter runs.
4. The executor imports no metrics: what it reports goes to its observers (``outbox.observers``),
   so a new metric is an observer of its own and never a change to the executor.
"""

from __future__ import annotations

import ast
import asyncio
import re
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from outbox import (
    Abandoned,
    ActionAttempt,
    ActionKind,
    ActionRequest,
    Done,
    Retry,
    TransactionOpenError,
    enqueue,
)
from outbox.store import held_connections
from outbox.testing import drain
from tests.support import rows

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("outbox", "workers")
#: The one module allowed to call an adapter's ``execute``.
EXECUTOR = "outbox/executor.py"
#: The one package allowed to import aiosmtplib.
EMAIL_PACKAGE = "outbox/email/"
#: The packages allowed to import httpx: the adapters that speak HTTP.
HTTP_PACKAGES = ("outbox/webhook/", "outbox/issue_comment/", "outbox/chat_reply/")
#: ``.execute(`` on these receivers is a database cursor or connection (or a Redis pipeline),
#: not an adapter: ``cur.execute(sql)``, ``self.conn.execute(...)``, ``pipe.execute()``.
DATABASE_RECEIVER = re.compile(
    r"(^|_)(cur|cursor|conn|connection|session|tx|transaction|pipe|pipeline|db)s?$", re.I
)


@dataclass(frozen=True)
class Violation:
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.what}"


def modules(root: Path) -> list[tuple[str, ast.Module]]:
    """Every Python module under the packages, as (path relative to root, AST)."""
    found = []
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root).as_posix()
            found.append((relative, ast.parse(path.read_text(), filename=relative)))
    return found


def _receiver_name(node: ast.expr) -> str:
    """``cur`` for ``cur.execute``, ``conn`` for ``self.conn.execute``, ``""`` otherwise."""
    while isinstance(node, ast.Await | ast.Call):
        node = node.value if isinstance(node, ast.Await) else node.func
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def adapter_execute_calls(root: Path) -> list[Violation]:
    """Calls of ``<x>.execute(...)`` (or ``getattr(x, "execute")(...)``) outside the executor,
    where ``x`` is not a database handle."""
    found = []
    for path, tree in modules(root):
        if path == EXECUTOR:
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "execute":
                receiver = _receiver_name(func.value)
                if not DATABASE_RECEIVER.search(receiver):
                    found.append(Violation(path, node.lineno, f"{receiver or '?'}.execute(...)"))
            elif (
                isinstance(func, ast.Call)
                and isinstance(func.func, ast.Name)
                and func.func.id == "getattr"
                and any(isinstance(a, ast.Constant) and a.value == "execute" for a in func.args)
            ):
                found.append(Violation(path, node.lineno, 'getattr(..., "execute")(...)'))
    return found


def _imported_modules(tree: ast.Module) -> list[tuple[int, str]]:
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and (
                (isinstance(node.func, ast.Name) and node.func.id == "__import__")
                or (isinstance(node.func, ast.Attribute) and node.func.attr == "import_module")
            )
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names.append((node.lineno, node.args[0].value))
    return names


def smtp_imports(root: Path) -> list[Violation]:
    """Imports of aiosmtplib (static or by name) outside ``outbox/email/``."""
    found = []
    for path, tree in modules(root):
        if path.startswith(EMAIL_PACKAGE):
            continue
        for line, name in _imported_modules(tree):
            if name == "aiosmtplib" or name.startswith("aiosmtplib."):
                found.append(Violation(path, line, f"imports {name}"))
    return found


def http_imports(root: Path) -> list[Violation]:
    """Imports of httpx (static or by name) outside the HTTP kinds' packages."""
    found = []
    for path, tree in modules(root):
        if path.startswith(HTTP_PACKAGES):
            continue
        for line, name in _imported_modules(tree):
            if name == "httpx" or name.startswith("httpx."):
                found.append(Violation(path, line, f"imports {name}"))
    return found


def write_tree(root: Path, files: dict[str, str]) -> Path:
    for name, source in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(source)
    for package in PACKAGES:
        (root / package).mkdir(exist_ok=True)
    return root


# -- rule 1: only the executor calls an adapter's execute ------------------------------------------


def test_only_the_executor_calls_an_adapters_execute():
    assert [str(v) for v in adapter_execute_calls(ROOT)] == []
    # The rule reads the real executor: it is there, and it does call execute.
    executor_tree = dict(modules(ROOT))[EXECUTOR]
    assert any(
        isinstance(n, ast.Attribute)
        and n.attr == "execute"
        and _receiver_name(n.value) == "adapter"
        for n in ast.walk(executor_tree)
    )


def test_an_adapter_execute_call_outside_the_executor_is_caught(tmp_path):
    root = write_tree(
        tmp_path,
        {
            "outbox/executor.py": "async def run(adapter, a):\n    await adapter.execute(a)\n",
            "outbox/shortcut.py": (
                "async def run_now(self, attempt):\n"
                "    await self.cur.execute('SELECT 1')\n"  # a cursor: allowed
                "    return await self.adapters['EMAIL'].execute(attempt)\n"
            ),
            "workers/sneaky.py": (
                "async def go(adapter, attempt):\n"
                "    return await getattr(adapter, 'execute')(attempt)\n"
            ),
        },
    )
    assert [str(v) for v in adapter_execute_calls(root)] == [
        "outbox/shortcut.py:3: ?.execute(...)",
        'workers/sneaky.py:2: getattr(..., "execute")(...)',
    ]


# -- rule 2: only the email adapter imports aiosmtplib ---------------------------------------------


def test_only_the_email_package_imports_aiosmtplib():
    assert [str(v) for v in smtp_imports(ROOT)] == []


def test_an_aiosmtplib_import_outside_the_email_package_is_caught(tmp_path):
    root = write_tree(
        tmp_path,
        {
            "outbox/email/adapter.py": "import aiosmtplib\n",
            "outbox/notify.py": "from aiosmtplib import SMTP\n",
            "outbox/lazy.py": "import importlib\nsmtp = importlib.import_module('aiosmtplib')\n",
            "workers/mail.py": "import os, aiosmtplib.errors\n",
            "workers/fine.py": "import smtplib_helpers\n",
        },
    )
    assert [str(v) for v in smtp_imports(root)] == [
        "outbox/lazy.py:2: imports aiosmtplib",
        "outbox/notify.py:1: imports aiosmtplib",
        "workers/mail.py:1: imports aiosmtplib.errors",
    ]


# -- rule 3: only the HTTP kinds' packages import httpx -------------------------------------------


def test_only_the_http_kinds_packages_import_httpx():
    assert [str(v) for v in http_imports(ROOT)] == []
    assert any(
        name == "httpx"
        for path, tree in modules(ROOT)
        if path.startswith("outbox/webhook/")
        for _, name in _imported_modules(tree)
    )


def test_an_httpx_import_outside_the_http_kinds_is_caught(tmp_path):
    root = write_tree(
        tmp_path,
        {
            "outbox/chat_reply/adapter.py": "import httpx\n",
            "outbox/status.py": "from httpx import AsyncClient\n",
            "workers/hook.py": "import httpx._client\n",
        },
    )
    assert [str(v) for v in http_imports(root)] == [
        "outbox/status.py:1: imports httpx",
        "workers/hook.py:1: imports httpx._client",
    ]


# -- rule 4: no adapter runs while a database transaction is open ----------------------------------

GUARDED = ActionKind("GUARDED")


class PoolWatchingAdapter:
    """Records, at the moment it runs, whether its task holds an outbox connection and how many
    of the pool's connections are out (any one out could hold a transaction open)."""

    def __init__(self, pool_stats) -> None:
        self.pool_stats = pool_stats
        self.seen: list[tuple[int, int]] = []
        self.calls = 0

    async def execute(self, attempt: ActionAttempt):
        self.calls += 1
        stats = self.pool_stats()
        self.seen.append((held_connections.get(), stats["pool_size"] - stats["pool_available"]))
        if not await attempt.fence().begin_write():
            return Abandoned()
        return Retry() if attempt.attempt == 1 else Done()


def put(database_url, schema, n):
    with psycopg.connect(database_url) as conn:
        for i in range(n):
            request = ActionRequest(
                GUARDED, lane_key="one-lane", idempotency_key=f"k{i}", workspace_id="w"
            )
            enqueue(conn, request, schema=schema)
        conn.commit()


def test_the_executor_refuses_to_run_an_adapter_while_its_task_holds_a_connection(
    make_outbox, database_url, schema
):
    adapter = PoolWatchingAdapter(lambda: {"pool_size": 0, "pool_available": 0})
    ob = make_outbox()
    ob.register(GUARDED, adapter)
    ob.migrate()
    put(database_url, schema, 1)

    async def run_inside_a_connection():
        async with ob.store() as store:
            executor = ob.executor(store)
            claimed_at = time.monotonic()
            (claimed,) = await store.claim({GUARDED.name: 1}, ob.settings.lease)
            # The violation: an adapter run while this task holds a connection (a transaction
            # could be open on it).
            async with store.connection() as conn, conn.transaction():
                await executor.run(claimed, claimed_at)

    with pytest.raises(TransactionOpenError):
        asyncio.run(run_inside_a_connection())
    assert adapter.calls == 0
    with psycopg.connect(database_url) as conn:
        (row,) = rows(conn, schema)
    assert row["write_started_at"] is None  # the provider was never approached


def test_during_a_drain_every_adapter_runs_with_no_pool_connection_out(
    make_outbox, database_url, schema
):
    holder = {}
    adapter = PoolWatchingAdapter(lambda: holder["store"].pool.get_stats())
    ob = make_outbox()
    ob.register(GUARDED, adapter)
    ob.migrate()
    put(database_url, schema, 3)  # one lane: one attempt at a time, retries included
    original_store = ob.store

    def watched_store(*args, **kwargs):
        manager = original_store(*args, **kwargs)

        class Watch:
            async def __aenter__(self):
                holder["store"] = await manager.__aenter__()
                return holder["store"]

            async def __aexit__(self, *exc):
                return await manager.__aexit__(*exc)

        return Watch()

    ob.store = watched_store
    report = drain(ob)
    assert report.attempts == 6  # each action: a retry, then done
    assert adapter.seen == [(0, 0)] * 6


# -- rule 4: the executor reports to observers, never to metrics itself ----------------------------

#: What the executor must not import: metrics are an observer (outbox.metrics.MetricsObserver).
METRICS_MODULES = ("outbox.metrics", "prometheus_client")


def executor_metrics_imports(root: Path) -> list[Violation]:
    """Imports of the metrics (``import outbox.metrics``, ``from outbox import metrics``,
    ``from outbox.metrics import ...``, prometheus_client) in the executor."""
    tree = dict(modules(root))[EXECUTOR]
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        for name in names:
            if any(name == m or name.startswith(m + ".") for m in METRICS_MODULES):
                found.append(Violation(EXECUTOR, node.lineno, f"imports {name}"))
                break
    return found


def test_the_executor_imports_no_metrics():
    assert [str(v) for v in executor_metrics_imports(ROOT)] == []


def test_a_metrics_import_in_the_executor_is_caught(tmp_path):
    root = write_tree(
        tmp_path,
        {
            "outbox/executor.py": (
                "from outbox import metrics\n"
                "from outbox.observers import Observers\n"
                "import prometheus_client.core\n"
                "def f():\n    from outbox.metrics import record_attempt\n"
            ),
        },
    )
    assert [str(v) for v in executor_metrics_imports(root)] == [
        "outbox/executor.py:1: imports outbox.metrics",
        "outbox/executor.py:3: imports prometheus_client.core",
        "outbox/executor.py:5: imports outbox.metrics",
    ]
