# One command each: `make demo` runs the main demo, `make test` runs the whole suite.
# Both create the virtual environment first. `make demo` installs only the project and its
# runtime dependencies; `make test` (and lint, examples, bench) add the dev extras.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install --quiet --disable-pip-version-check
STAMP := $(VENV)/.installed
DEV_STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck examples bench bench-quick clean

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
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache benchmarks/out
