# One venv, made from the project's own files: `make run` and `make test` work on a fresh clone.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: install run test lint typecheck pytest clean ci-deps bench

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: install
	$(VENV)/bin/mcp-gateway run $(ARGS)

lint: install
	$(VENV)/bin/ruff check gateway tests bench
	$(VENV)/bin/ruff format --check gateway tests bench

typecheck: install
	$(VENV)/bin/mypy

pytest: install
	$(PY) -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

# System packages some tests use: Debian's `prometheus` (promtool, prometheus) for the Prometheus
# config checks and the real-scrape test. Without apt (or root) it says so; those tests then skip
# with the reason outside CI and fail under CI=true.
ci-deps:
	@command -v promtool >/dev/null 2>&1 || { \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo='sudo -n'; \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null \
	  || echo "ci-deps: could not install prometheus with apt; its tests will skip" >&2; }

# The benchmark (bench/README.md); e.g. `make bench ARGS="--quick --no-proxies"`.
bench: install
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m bench $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info
