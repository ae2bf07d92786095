# pulsar-chaos: `make run` (a default run end to end), `make test` (every test). Both set up first.
.PHONY: setup run test test-fast bench clean-clusters docker-image
VENV ?= .venv
PYTEST_ARGS ?=
# test processes (pytest-xdist; a test file stays in one process, so its cluster fixtures are shared).
# Three on a 2-core machine: the suite mostly waits on clusters (about 12 of 15 minutes' CPU in use)
TEST_JOBS ?= 3
# `make setup BACKEND=docker` (or PULSAR_CHAOS_BACKEND=docker) also sets up the docker backend
BACKEND ?= $(PULSAR_CHAOS_BACKEND)

setup:
	@./scripts/setup.sh
	@if [ "$(BACKEND)" = docker ]; then ./scripts/docker-setup.sh; fi

# the docker backend's node image (installs and starts docker first if needed); skipped when up to date
docker-image:
	@./scripts/docker-setup.sh

run: setup
	$(VENV)/bin/pulsar-chaos run --time-limit 60

test: setup
	$(VENV)/bin/pytest -n $(TEST_JOBS) --dist loadfile $(PYTEST_ARGS)

# unit tests only (no root, no namespaces)
test-fast: setup
	$(VENV)/bin/pytest -m "not integration" $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/python bench/pubsub.py

clean-clusters: setup
	$(VENV)/bin/pulsar-chaos cluster down --force
