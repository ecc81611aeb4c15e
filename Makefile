# Two commands on a fresh machine:  `make demo`  and  `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: install demo test test-embedded lint bench soak services-up services-down clean

install: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: install  ## the finance story, embedded: no servers
	$(BIN)/keel demo

test: install  ## the whole suite; starts local Kafka and Redis unless KEEL_KAFKA_BOOTSTRAP/KEEL_REDIS_URL are set
	scripts/with-services $(BIN)/python -m pytest

test-embedded: install  ## only the tests that need no servers
	$(BIN)/python -m pytest -m "not services"

lint: install
	$(BIN)/ruff check keel workers tools_server cartridges tests bench

bench: install
	$(BIN)/python bench/embedded.py

SOAK ?= --minutes 30
soak: install  ## opt-in: the rebalance scenarios many times, big backlogs, random moments (SOAK="--runs 20 --events 300000")
	scripts/with-services $(BIN)/python scripts/soak.py $(SOAK)

services-up:
	deploy/local/services up

services-down:
	deploy/local/services down

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis
