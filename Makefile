# Two commands on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install demo test test-fast test-deploy test-embedded images compose-up lint bench bench-peers soak services-up services-down clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: install  ## the finance story, embedded: no servers
	$(BIN)/keel demo

# pytest-xdist workers: while one test waits on Kafka, Redis or a subprocess another computes, so more workers than
# cores pay. tests/conftest.py's scheduler runs each serial tier (SERIAL_TIERS) one test at a time and each module
# with a costly shared fixture (ONE_WORKER_MODULES) on one worker, and hands those out first. Default 4: on 2 cores
# the whole suite passed on 4 workers in 17.5 minutes (22 in one process), the rebalance tier passing in each of
# three runs on 4 workers (docs/architecture.md, "The suite"); TEST_WORKERS=0: one process.
TEST_WORKERS ?= 4
PARALLEL := -n $(TEST_WORKERS)
# bytecode kept under .cache/pycache, also where PYTHONDONTWRITEBYTECODE is set: the suite starts hundreds of keel
# processes, and each compiled keel again without it (tests/test_outbox.py: 26 s CPU without, 19 s with)
PYCACHE := PYTHONDONTWRITEBYTECODE= PYTHONPYCACHEPREFIX=$(CURDIR)/.cache/pycache

test: install  ## the whole suite; starts local Kafka, Redis and PostgreSQL unless KEEL_* point at them, and a container engine for the deploy tier
	scripts/ensure-promtool  # Debian's prometheus package, for promtool (tests/test_alert_rules.py)
	scripts/ensure-chromium  # Debian's chromium and chromium-driver, for the inspector's browser test
	scripts/ensure-clients  # the real MCP clients the agent-client tests drive (tests/clients/, docs/agents.md)
	deploy/local/connect/connect jars >/dev/null  # Kafka Connect and Debezium's jars, once (the cdc tier)
	$(PYCACHE) scripts/with-services scripts/with-engine $(BIN)/python -m pytest $(PARALLEL) --durations=30  # the slowest tests, for the suite-time goal

# the slow tiers' pytest markers (tests/conftest.py TIERS); `make test-fast` leaves them out
SLOW_TIERS := faults or deploy or rebalance or chaos or rolling_segments or cdc
test-fast: install  ## the suite without its slow tiers (SLOW_TIERS): the loop while working; `make test` runs them all
	scripts/ensure-promtool
	scripts/ensure-chromium
	scripts/ensure-clients
	$(PYCACHE) scripts/with-services $(BIN)/python -m pytest $(PARALLEL) -m "not ($(SLOW_TIERS))"

test-deploy: install  ## only the deploy tier: images from deploy/, the stack in containers, the compose file
	scripts/with-engine env KEEL_REQUIRE_SERVICES=1 $(BIN)/python -m pytest tests/deploy

images:  ## build keel, keel-kafka, keel-redis and keel-postgres on a local Debian base (no registry needed)
	deploy/engine images

compose-up:  ## deploy/compose.yaml up, waiting until every service is healthy; fails naming a crash-looping one
	deploy/compose-up

test-embedded: install  ## only the tests that need no servers
	$(BIN)/python -m pytest -m "not services" --ignore=tests/deploy

lint: install
	$(BIN)/ruff check keel workers tools_server inspector cartridges tests bench
	$(BIN)/mypy    # the public Python API, strict (pyproject.toml [tool.mypy], docs/python.md)

bench: install
	$(BIN)/python bench/embedded.py

bench-peers: install  ## the worker, a quix-streams app and a bare faust agent on one topic (needs KEEL_KAFKA_BOOTSTRAP)
	$(BIN)/pip install -q -e ".[dev,bench]"
	$(BIN)/python bench/peers/compare.py

SOAK ?= --minutes 30
CHAOS_MINUTES ?= 60
CHAOS_SEED ?= 44
soak: install  ## opt-in, before a release: the rebalance scenarios many times (SOAK="--runs 20 --events 300000"), then an hour of the chaos tier's faults (CHAOS_MINUTES, CHAOS_SEED)
	scripts/with-services $(BIN)/python scripts/soak.py $(SOAK)
	KEEL_CHAOS_MINUTES=$(CHAOS_MINUTES) KEEL_CHAOS_SEED=$(CHAOS_SEED) KEEL_CHAOS_TIMEOUT=$$(( $(CHAOS_MINUTES) * 60 + 1800 )) $(BIN)/python -m pytest -s tests/chaos

services-up:
	deploy/local/services up

services-down:
	deploy/local/services down

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
