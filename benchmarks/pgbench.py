"""The PostgreSQL commit ceiling, measured with ``pgbench`` in the same run as what it bounds.

The script is the smallest honest model of one action's life: one INSERT and one UPDATE of the
row it inserted, in one transaction, from ``clients`` connections at once.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import psycopg

from benchmarks.common import DATABASE_URL

SCRIPT = """\
BEGIN;
INSERT INTO {s}.pgbench_action (state) VALUES ('ADMITTED') RETURNING id \\gset
UPDATE {s}.pgbench_action SET state = 'DONE' WHERE id = :id;
END;
"""


@dataclass(frozen=True)
class Ceiling:
    """Transactions a second pgbench reached, with ``clients`` connections."""

    tps: float
    clients: int
    seconds: float
    latency_ms: float | None

    @property
    def name(self) -> str:
        return f"pgbench-insert-update-c{self.clients}"


def available() -> bool:
    return shutil.which("pgbench") is not None


def measure(schema: str, clients: int, seconds: float, database_url: str = DATABASE_URL) -> Ceiling:
    """Runs pgbench for ``seconds`` on a scratch table in ``schema`` (created here)."""
    s = f'"{schema}"'
    with psycopg.connect(database_url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {s}")
        conn.execute(
            f"CREATE TABLE IF NOT EXISTS {s}.pgbench_action (id bigint GENERATED ALWAYS AS"
            " IDENTITY PRIMARY KEY, state text NOT NULL)"
        )
    with tempfile.NamedTemporaryFile("w", suffix=".sql") as script:
        script.write(SCRIPT.format(s=s))
        script.flush()
        out = subprocess.run(
            [
                "pgbench",
                "-n",  # no vacuum of pgbench's own tables: it has none here
                "-c",
                str(clients),
                "-j",
                str(min(clients, 2)),
                "-T",
                str(max(1, round(seconds))),
                "-f",
                script.name,
                database_url,
            ],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    tps = re.search(r"tps = ([\d.]+)", out)
    latency = re.search(r"latency average = ([\d.]+) ms", out)
    if tps is None:
        raise RuntimeError(f"pgbench printed no tps:\n{out}")
    return Ceiling(
        float(tps.group(1)), clients, seconds, float(latency.group(1)) if latency else None
    )
