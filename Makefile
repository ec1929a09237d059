# The newcomer's commands (README.md). Everything installs into .venv from this repo's files.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install test demo lint typecheck schema

$(BIN)/outbox: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,embedded]'
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
