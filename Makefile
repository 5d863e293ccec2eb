# One venv, made from the project's own files: `make run` and `make test` work on a fresh clone.
VENV ?= .venv
PY := $(VENV)/bin/python
# Two stamps: `make run` needs the runtime only (the package and its dependencies); lint,
# typecheck and the tests add the dev tools of the `test` extra on top, once.
RUN_STAMP := $(VENV)/.installed-run
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: help install run test test-fast lint typecheck pytest clean ci-deps npm-deps bench bench-check schema docs docs-build

help:
	@echo "make install    venv + editable install with the test and docs extras"
	@echo "make run        the gateway (ARGS=...)"
	@echo "make test-fast  the engine-rule tests: no process, no server, no npm; under a minute"
	@echo "make test       lint + typecheck + the whole suite (pytest; about 20 minutes)"
	@echo "make lint | typecheck | pytest (PYTEST_ARGS=...) | bench (ARGS=...) | schema | clean"
	@echo "make docs       the docs site (mkdocs.yml, docs/) served on http://127.0.0.1:8000, rebuilt on save"
	@echo "make docs-build the docs site built into site/, strict: a warning or a broken link fails it"
	@echo "make ci-deps | npm-deps   system and npm tools some tests use (else they skip)"
	@echo "make bench-check  the gateway against its floors (a few minutes); run it before merging"
	@echo "                  anything on the request path: exits 1 when a target fails"

$(RUN_STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e .
	touch $(RUN_STAMP)

$(DEV_STAMP): $(RUN_STAMP)
	$(PY) -m pip install --quiet -e '.[test,docs]'
	touch $(DEV_STAMP)

install: $(DEV_STAMP)

run: $(RUN_STAMP)
	$(VENV)/bin/mcp-transparent-gateway run $(ARGS)

lint: $(DEV_STAMP)
	$(VENV)/bin/ruff check gateway tests bench docs/hooks.py
	$(VENV)/bin/ruff format --check gateway tests bench docs/hooks.py

typecheck: $(DEV_STAMP)
	$(VENV)/bin/mypy

pytest: $(DEV_STAMP) npm-deps
	$(PY) -m pytest $(PYTEST_ARGS)

# npm tools the tests use (tests/npm/package.json, exact versions in its package-lock.json):
# node 24 (the official conformance suite needs node >= 22; the machine's node may be older),
# @modelcontextprotocol/conformance, the reference servers, oidc-provider (the authorization
# server of tests/caller_auth/test_auth_oidc.py) and playwright-core (drives chromium through
# its login page, tests/servers/browser_login.mjs). Installed with the machine's npm into
# tests/npm/node_modules, again only when the lock file changes (the stamp). Without npm (or
# when `npm ci` fails) it says so and those tests skip; with CI=true it fails instead.
NPM_DIR := tests/npm
NPM_STAMP := $(NPM_DIR)/node_modules/.installed

$(NPM_STAMP): $(NPM_DIR)/package.json $(NPM_DIR)/package-lock.json
	@if command -v npm >/dev/null 2>&1 \
	    && (cd $(NPM_DIR) && npm ci --no-audit --no-fund --loglevel=error); then \
	  touch $(NPM_STAMP); \
	elif [ "$$CI" = true ]; then \
	  echo "npm-deps: could not install $(NPM_DIR) with npm; CI needs it" >&2; exit 1; \
	else \
	  echo "npm-deps: could not install $(NPM_DIR) with npm; the tests needing them will skip" >&2; \
	fi

npm-deps: $(NPM_STAMP)

test: lint typecheck pytest

# The tests that start no process and listen on no socket (tests/fast.py finds them by reading
# the tests and their fixtures and helpers, and fails one that starts something anyway): the
# engine rules against in-memory backends, in under a minute. No npm needed.
test-fast: $(DEV_STAMP)
	$(PY) -m pytest -q -m fast $(PYTEST_ARGS)

# The config's JSON Schema shipped in the package, made from the loader's key tables
# (gateway/config/keys.py, read off the model's fields); tests/config/test_config_schema.py
# fails when it is stale.
schema: install
	$(PY) -m gateway schema > gateway/config/schema.json

# System packages some tests use: Debian's `prometheus` (promtool, prometheus) for the Prometheus
# config checks and the real-scrape test, and Debian's `chromium` (headless, driven by npm's
# playwright-core) for the browser logins at the authorization server
# (tests/servers/browser_login.mjs), and Debian's `nginx` in front of gateway replicas
# (tests/system/test_replicas_nginx.py runs deploy/nginx/mcp-gateway.conf; the service the
# package starts is stopped: the tests run their own), and Debian's `redis-server` for the rate
# limits replicas share (tests/cluster/test_shared_rate_limits.py starts its own on a free
# loopback port; the service the package starts is stopped too), and Debian's `valgrind` for
# `python -m bench.instructions` (tests/system/test_bench_instructions.py runs it for real,
# about 30 s: a bench tool nothing else runs would rot unnoticed). Without apt (or root) it says
# so; those tests then skip with the reason outside CI and fail under CI=true.
ci-deps:
	@command -v promtool >/dev/null 2>&1 || { \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo='sudo -n'; \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null \
	  || echo "ci-deps: could not install prometheus with apt; its tests will skip" >&2; }
	@[ -x /usr/sbin/nginx ] || { \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo='sudo -n'; \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends nginx; } >/dev/null \
	  || echo "ci-deps: could not install nginx with apt; the replica tests will skip" >&2; \
	  $$sudo service nginx stop >/dev/null 2>&1 || true; }
	@[ -x /usr/bin/redis-server ] || { \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo='sudo -n'; \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends redis-server; } >/dev/null \
	  || echo "ci-deps: could not install redis-server with apt; the shared rate-limit tests will skip" >&2; \
	  $$sudo service redis-server stop >/dev/null 2>&1 || true; }
	@command -v callgrind_control >/dev/null 2>&1 || { \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo='sudo -n'; \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends valgrind; } >/dev/null \
	  || echo "ci-deps: could not install valgrind with apt; the instruction-count test will skip" >&2; }
	@[ -x /usr/bin/chromium ] || { \
	  sudo=; [ "$$(id -u)" = 0 ] || sudo='sudo -n'; \
	  { $$sudo apt-get update -qq && $$sudo env DEBIAN_FRONTEND=noninteractive \
	      apt-get install -y -qq --no-install-recommends chromium; } >/dev/null \
	  || echo "ci-deps: could not install chromium with apt; the browser login tests will skip" >&2; }

# The benchmark (bench/README.md); e.g. `make bench ARGS="--quick --no-proxies"`.
bench: $(RUN_STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m bench $(ARGS)
	$(PY) -m bench.search
	$(PY) -m bench.search_e2e

# Before merging anything on the request path: the gateway against its floors (bare aiohttp hop,
# bare stdio bridge), 3 interleaved rounds, a few minutes; exits 1 when a CPU, rps or +p50 target
# fails (bench/README.md). A benchmark, not a test: CI does not run it.
bench-check: $(RUN_STAMP)
	$(PY) -m pip install --quiet -e '.[bench]'
	$(PY) -m bench --check $(ARGS)

# The docs site (MkDocs, Material theme): pages from docs/, the configuration and CLI references
# generated at build time by docs/hooks.py. `make test` builds it too (tests/docs/test_site.py).
# NO_MKDOCS_2_WARNING: Material's banner about its successor, printed at every build.
DOCS_ENV := NO_MKDOCS_2_WARNING=1

docs: $(DEV_STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs serve

docs-build: $(DEV_STAMP)
	$(DOCS_ENV) $(VENV)/bin/mkdocs build --strict

clean:
	rm -rf $(VENV) build *.egg-info $(NPM_DIR)/node_modules site
