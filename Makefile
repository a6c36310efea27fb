# One command each: `make demo` runs the main demo, `make test` runs the whole suite.
# Both create the virtual environment first. `make demo` installs only the project and its
# runtime dependencies; `make test` (and lint, examples, bench) add the dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test test-trl-lowest lint typecheck examples bench bench-quick clean \
	build-cluster cluster-up cluster-down test-cluster

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) -e .
	touch $(STAMP)

$(DEV_STAMP): $(STAMP)
	$(PIP) -e '.[dev]'
	touch $(DEV_STAMP)

demo: $(STAMP)
	$(PY) examples/reward_function.py

test: $(DEV_STAMP)
	$(PY) -m pytest

# The TRL tests again on the lowest TRL the trl extra allows, in .venv-trl-lowest (needs the trl
# extra installed in .venv: torch, transformers and the rest are reused from there).
test-trl-lowest: $(DEV_STAMP)
	$(PY) tests/trl_lowest.py

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
	rm -rf $(VENV) .venv-trl-lowest .pytest_cache .mypy_cache .ruff_cache benchmarks/out
