# The two commands of the README:
#   make demo   set everything up, then run the bundled scenario on the embedded default
#   make test   set everything up, make sure RabbitMQ answers, then run the whole test suite
# and, while working: make test-fast (the unit, contract, arch, CLI and service tests not marked slow);
# make test-deep runs the seed sweeps (marked `deep`) with every seed, where make test runs a subset
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
# torch is installed first and pinned, so that the `worker` extra's range is already met and pip
# never pulls a multi-GB CUDA build. On a machine without the wheel on disk, point pip at a CPU
# index: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make test
TORCH ?= torch==2.13.0

.PHONY: install demo test test-fast test-deep broker prometheus bench clean

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check "$(TORCH)" 2>&1 | grep -v "is ignored" || true
	@$(PY) -c "import importlib.util as u, sys; sys.exit(u.find_spec('torch') is None)" || { echo "make: installing $(TORCH) failed (see above)"; exit 1; }
	$(PY) -m pip install --quiet --disable-pip-version-check -e ".[amqp,worker,dev]" 2>&1 | grep -v "is ignored" || true
	@$(PY) -c "import aio_pika, cvxpy, msgpack, structlog, pytest, hypothesis, xdist, yaml, prometheus_client, rich" || { echo "make: installing the project failed (see above)"; exit 1; }
	@touch $(STAMP)

# The project's bytecode, compiled ahead (as pip does for a regular install): an editable install
# has none, and where PYTHONDONTWRITEBYTECODE is set (this machine, its CI) every command would
# otherwise compile the ~100 modules it imports, ~0.3 s of each `gavel simulate`. Up-to-date
# files are skipped, so this costs a moment after the first time.
PACKAGES := common services policy_service mechanism_service estimator_service worker_service sim

install: $(STAMP)
	@$(PY) -m compileall -q -j 0 $(PACKAGES)

demo: install
	$(VENV)/bin/gavel demo

broker:
	@scripts/ensure-broker

# The `prometheus` binary tests/e2e/test_prometheus.py runs against the services (installed from
# Debian's package when missing; under `make test` its absence fails that test, never skips it).
prometheus:
	@scripts/ensure-prometheus

# The suite on both cores, in three xdist workers: many slow tests wait (a scaled clock's rounds,
# processes starting, a broker's redelivery) more than they compute, and a third worker runs
# while two wait (tests/README.md says how tests keep apart). Broker tests
# fail, never skip, when no broker answers. No test stops the shared broker: the chaos test restarts
# a RabbitMQ node of its own (tests/support/rabbit_node.py), so it runs beside the rest.
TEST_WORKERS ?= 3
PYTEST := GAVEL_REQUIRE_BROKER=1 $(PY) -m pytest -n $(TEST_WORKERS) --dist loadgroup

test: install broker prometheus
	$(PYTEST)

test-fast: install broker
	$(PYTEST) -m "not slow" tests/unit tests/contract tests/arch tests/cli tests/service

# The deeper tier: the seed sweeps (marked `deep`: fault schedules, random states, hostile bodies)
# with every seed, where `make test` runs a representative subset of each (tests/support/seeds.py,
# tests/README.md). GAVEL_DEEP_TESTS=1 with any other command runs them in full too.
test-deep: install broker
	GAVEL_DEEP_TESTS=1 $(PYTEST) -m deep

bench: install broker
	$(PY) bench/bus_throughput.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info
