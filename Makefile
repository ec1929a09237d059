# The newcomer's commands (README.md). Everything installs into .venv from this repo's files.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install test demo lint typecheck schema lock

# Every dependency at the version constraints.txt pins (`make lock` writes it from pyproject.toml):
# a checkout installs today what it installed the day it was locked. The `bench` extra (the
# benchmarks' peers, pure Python but for uvloop and pydantic-core wheels) too, so that the smoke
# test runs the peer scenarios as well instead of skipping them.
$(BIN)/outbox: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c constraints.txt -e '.[test,embedded,bench]'
	$(BIN)/pip install -q --no-deps 'dramatiq-dashboard==0.4.0'
	touch $(BIN)/outbox

install: $(BIN)/outbox

test: install
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q

demo: install
	$(BIN)/outbox demo

lint: install
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# mypy on the whole package ([tool.mypy] in pyproject.toml: strict for the core modules).
typecheck: install
	$(BIN)/mypy

# schema.sql from a freshly migrated throwaway schema (rerun after adding a migration).
schema: install
	$(BIN)/python -m scripts.schema_snapshot

# The lock files, after changing a dependency in pyproject.toml (tests/test_ops_lock.py fails until
# they are rewritten): constraints.txt pins what `make install` installs; requirements-image.txt,
# with the hashes of every file, what the Dockerfile installs (the same versions, no test tools,
# no embedded PostgreSQL). Universal: the pins hold on every platform, Python 3.11 and later.
UV := $(BIN)/uv
COMPILE := $(UV) pip compile pyproject.toml --universal --python-version 3.11 --quiet \
	--custom-compile-command 'make lock'

lock: install
	$(BIN)/pip install -q 'uv==0.13.9'
	$(COMPILE) --extra test --extra embedded --extra bench -o constraints.txt
	$(COMPILE) --extra celery -c constraints.txt --generate-hashes -o requirements-image.txt
