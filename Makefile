# One command each: `make demo` runs the main demo, `make test` runs the whole suite.
# Both create the virtual environment and install the project first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-dev

.PHONY: demo test lint typecheck examples bench bench-quick clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) examples/reward_function.py

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(PY) -m ruff check cwsandbox_async tests benchmarks examples
	$(PY) -m ruff format --check cwsandbox_async tests benchmarks examples
	$(PY) -m mypy

examples: $(STAMP)
	$(PY) -m pytest -q tests/test_examples.py

bench: $(STAMP)
	$(PY) -m benchmarks

bench-quick: $(STAMP)
	$(PY) -m benchmarks --quick

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache benchmarks/out
