"""Loads the named statements of ``sql/queries.sql`` once, for one schema."""

from __future__ import annotations

import re
from functools import cache
from importlib import resources

from outbox.errors import ConfigurationError

_SCHEMA_NAME = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
_HEADER = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def validate_schema(schema: str) -> str:
    """A schema name the outbox accepts: lower-case, so it needs no quoting rules of its own."""
    if not _SCHEMA_NAME.match(schema):
        raise ConfigurationError(
            f"schema {schema!r} must match {_SCHEMA_NAME.pattern} (lower-case letters, digits, _)"
        )
    return schema


def _parse(text: str) -> dict[str, str]:
    parts = _HEADER.split(text)
    queries: dict[str, str] = {}
    # parts = [preamble, name1, body1, name2, body2, ...]
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.strip().splitlines() if not line.startswith("--")]
        queries[name] = "\n".join(lines).strip()
    return queries


@cache
def _raw() -> dict[str, str]:
    return _parse(resources.files("outbox").joinpath("sql/queries.sql").read_text())


@cache
def queries_for(schema: str) -> dict[str, str]:
    """Every named statement with ``{schema}`` filled in."""
    quoted = f'"{validate_schema(schema)}"'
    return {name: sql.replace("{schema}", quoted) for name, sql in _raw().items()}
