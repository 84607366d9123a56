# The verbs a newcomer looks for. Everything installs into .venv; the test
# binaries (kube-apiserver, etcd) are built once into ~/.cache/dwd-lease.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml | sha256sum | cut -c1-12)
PYTEST_ARGS ?=

.PHONY: deps install testenv test unit integration e2e lint fmt bench demo clean coverage

install: $(STAMP)

# Debian packages the tests need (chromium for the status page); a no-op when present.
deps:
	bash scripts/deps.sh

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	rm -f $(VENV)/.installed-* && touch $@

testenv: install
	$(BIN)/python -m testenv build

test: deps install testenv
	$(BIN)/pytest $(PYTEST_ARGS)

unit: install
	$(BIN)/pytest tests/unit $(PYTEST_ARGS)

integration: deps install testenv
	$(BIN)/pytest tests/integration $(PYTEST_ARGS)

e2e: deps install testenv
	$(BIN)/pytest tests/e2e $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: install
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

bench: install testenv
	$(BIN)/python -m bench

demo: install testenv
	$(BIN)/python -m demo

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache

# Line coverage of the aggregator's I/O modules by the unit tests alone, module by module.
IO_MODULES := aggregator/leader.py,aggregator/watcher.py,aggregator/scaler.py,aggregator/target.py,aggregator/provisioner.py,aggregator/fleet.py,aggregator/sources.py
coverage: install
	$(BIN)/coverage run -m pytest -q tests/unit $(PYTEST_ARGS)
	$(BIN)/coverage report --include='$(IO_MODULES)'
