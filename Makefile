# pulsar-chaos: `make run` (a default run end to end), `make test` (every test). Both set up first.
.PHONY: setup run test test-fast bench clean-clusters
VENV ?= .venv
PYTEST_ARGS ?=

setup:
	@./scripts/setup.sh

run: setup
	$(VENV)/bin/pulsar-chaos run --time-limit 60

test: setup
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# unit tests only (no root, no namespaces)
test-fast: setup
	$(VENV)/bin/pytest -m "not integration" $(PYTEST_ARGS)

bench: setup
	$(VENV)/bin/python bench/pubsub.py

clean-clusters: setup
	$(VENV)/bin/pulsar-chaos cluster down --force
