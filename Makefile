# Cellpilot: every developer and CI action is one target here.
# `make test` and `make run` install whatever is missing first.

PYTHON_BOOT ?= python3
VENV        ?= .venv
PY          := $(VENV)/bin/python
STACK_DIR   ?= .cellpilot/stack
BENCH       ?=
BENCH_SIZE  ?= full
PYTEST_ARGS ?=
# The suite runs in this many worker processes (pytest-xdist), each with its own embedded stack;
# tests that need `cellpilot run`'s fixed ports share one worker (xdist_group "fixed-ports").
TEST_WORKERS ?= 2
XDIST        := -n $(TEST_WORKERS) --dist loadgroup
CHAOS_ARGS  ?=

.PHONY: help install proto proto-check lint format typecheck importlint check test test-unit \
        test-integration test-containers browser broker bench chaos run stop stack-up stack-down stack-status images lock clean

help:
	@echo "make install          create $(VENV) and install pinned dependencies (requirements.lock)"
	@echo "make run              start the embedded stack and every service (Ctrl-C or make stop ends it)"
	@echo "make stop             stop everything make run started"
	@echo "make test             lint, type-check, generated-code check, unit and integration tests"
	@echo "make browser          install Chromium (the dashboard browser tests) when it is missing"
	@echo "make broker           build the durable broker (Tansu with SQLite storage) once, into ~/.cache/cellpilot"
	@echo "make test-containers  the compose stack's tests (needs Docker)"
	@echo "make bench [BENCH=prefix] [BENCH_SIZE=smoke]  run benchmarks, write bench-results.json"
	@echo "make chaos            one chaos run: faults in turn under make run's system, invariants as figures"
	@echo "make proto            regenerate libs/cellpilot/api from proto/"
	@echo "make images           build every image docker-compose.yml needs, with no registry"
	@echo "make lock             regenerate requirements.lock and requirements-dev.lock"

$(VENV)/.installed: pyproject.toml setup.py requirements.lock requirements-dev.lock
	@test -x $(PY) || $(PYTHON_BOOT) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip setuptools wheel
	$(PY) -m pip install --quiet -c requirements-dev.lock -e '.[dev]'
	@touch $@

install: $(VENV)/.installed

proto: install
	$(PY) infra/proto/generate.py

proto-check: install
	$(PY) infra/proto/generate.py --check

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

format: install
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

typecheck: install
	$(VENV)/bin/mypy

importlint: install
	$(VENV)/bin/lint-imports

check: proto-check lint typecheck importlint

# The dashboard's browser tests need Chromium: installed with the system's package manager when
# missing; when that fails, one line says why and those tests fail with it (they never skip).
browser:
	@infra/scripts/ensure_chromium.sh

# The durable broker (Tansu with its SQLite storage engine and SCRAM users), built once into
# ~/.cache/cellpilot and reused; without cargo, one line and a warning: the stack falls back to the
# in-memory broker (cellpilot.stack.broker_build).
broker: install
	$(PY) -c "import sys; from cellpilot.stack.broker_build import main; sys.exit(main())"

test: check browser broker
	$(VENV)/bin/pytest $(XDIST) $(PYTEST_ARGS)

test-unit: install
	$(VENV)/bin/pytest tests/unit $(XDIST) $(PYTEST_ARGS)

test-integration: install browser broker
	$(VENV)/bin/pytest tests/integration $(XDIST) $(PYTEST_ARGS)

test-containers: install
	$(VENV)/bin/pytest tests/containers -m containers $(PYTEST_ARGS)

bench: install
	$(PY) -m bench.run --prefix '$(BENCH)' --size '$(BENCH_SIZE)'

# Kills and restarts every kind of process while the demo runs; prints CHAOS lines, writes
# chaos-results.json, exits 1 if an invariant failed (python -m cellpilot.chaos --help).
chaos: install
	$(PY) -m cellpilot.chaos --out chaos-results.json $(CHAOS_ARGS)

run: install broker
	$(VENV)/bin/cellpilot run --data-dir $(STACK_DIR)

stop: install
	$(VENV)/bin/cellpilot stop --data-dir $(STACK_DIR)

stack-up: install broker
	$(VENV)/bin/cellpilot stack up --data-dir $(STACK_DIR)

stack-down: install
	$(VENV)/bin/cellpilot stack down --data-dir $(STACK_DIR)

stack-status: install
	$(VENV)/bin/cellpilot stack status --data-dir $(STACK_DIR)

images: install
	infra/images/build_images.sh $(IMAGES_ARGS)

# Regenerate both lock files from pyproject.toml (needs PyPI).
lock:
	rm -rf /tmp/cellpilot-lock && $(PYTHON_BOOT) -m venv /tmp/cellpilot-lock
	/tmp/cellpilot-lock/bin/pip install --quiet -e . && /tmp/cellpilot-lock/bin/pip freeze --exclude-editable \
	  | sed '1i # Runtime pins (what the service images install). Regenerate with make lock.' > requirements.lock
	/tmp/cellpilot-lock/bin/pip install --quiet -e '.[dev]' && /tmp/cellpilot-lock/bin/pip freeze --exclude-editable \
	  | sed '1i # Every pin, runtime and development (make install uses it as constraints). Regenerate with make lock.' \
	  > requirements-dev.lock

clean:
	rm -rf build *.egg-info .pytest_cache .mypy_cache .ruff_cache bench-results.json chaos-results.json
