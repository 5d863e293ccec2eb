# One venv, made from the project's own files: `make run` and `make test` work on a fresh clone.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test lint typecheck pytest clean

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/mcp-gateway run $(ARGS)

lint: install
	$(VENV)/bin/ruff check gateway tests
	$(VENV)/bin/ruff format --check gateway tests

typecheck: install
	$(VENV)/bin/mypy

pytest: install
	$(PY) -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

clean:
	rm -rf $(VENV) build *.egg-info
