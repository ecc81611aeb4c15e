"""Shared test configuration: the slow tiers' markers, given by path, and access to real Kafka/Redis from the
environment. Every marker is declared in pyproject.toml ([tool.pytest.ini_options] markers)."""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Any

import pytest
from support import output_schemas
from support.services import service_env

ROOT = Path(__file__).resolve().parents[1]


# The slow tiers, each a marker given to the tests whose node id starts with one of its places: `make test-fast`
# leaves them out (SLOW_TIERS in the Makefile), `make test` runs every tier. A test added under one of these
# places joins its tier; tests/test_tiers.py keeps this table, pyproject.toml's markers and the Makefile agreeing.
TIERS = {
    "faults": ("tests/faults/",),
    "deploy": ("tests/deploy/",),
    "rebalance": ("tests/test_workers_rebalance.py",),
    # three Kafka brokers, Redis under three Sentinels, three workers; kills, pauses, failovers, out of memory
    "chaos": ("tests/chaos/",),
    # PostgreSQL with wal_level=logical, Kafka Connect and the Debezium connector, the relay killed and restarted
    "cdc": ("tests/test_cdc_debezium.py",),
    # the Redis store closing a segment after every step, its random writes against the memory store: minutes each
    "rolling_segments": ("tests/test_store_redis.py::TestRedisStoreRollingEveryStep::test_random_writes",
                         "tests/test_redis_cluster.py::TestRedisClusterStore::test_random_writes"),
}


def tiers_of(nodeid: str) -> list[str]:
    """The slow tiers of a test, by its node id (most tests are in none)."""
    return [tier for tier, places in TIERS.items() if nodeid.startswith(places)]


# `make test` runs the suite on several pytest-xdist workers. Tests share nothing (each uses its own namespaces,
# topics, schemas, ports and tmp_path), except these, each group kept on one worker:
# - each serial tier, one of its tests after the other: they stop and restart their private services, run groups of
#   worker processes through rebalances, or run the stack in containers (two tiers may run at once, on two workers:
#   each has its own services, containers or topics);
SERIAL_TIERS = ("faults", "deploy", "rebalance", "chaos", "cdc")
# - the modules whose module-scoped fixture starts something costly (Keycloak, a browser, a served graph), so that it
#   starts once rather than once per worker. (tests/test_redis_cluster.py's session Cluster starts on each worker
#   that runs one of its tests, on that worker's own ports: a few seconds, paid back by spreading its tests.)
ONE_WORKER_MODULES = ("tests/test_oauth_keycloak.py", "tests/test_inspector_browser.py", "tests/test_inspector.py",
                      "tests/test_mcp_http.py", "tests/test_oauth.py")


def xdist_group_of(nodeid: str) -> str | None:
    """The group of a test whose tests run on one pytest-xdist worker (None: any worker, beside any test)."""
    serial = [tier for tier in tiers_of(nodeid) if tier in SERIAL_TIERS]
    if serial:
        return f"tier:{serial[0]}"
    module = nodeid.split("::")[0]
    return module if module in ONE_WORKER_MODULES else None


def _rank(unit: str) -> int:
    """The order in which the scheduler hands out units of work: serial tiers, one-worker modules, single tests."""
    return 0 if unit.startswith("tier:") else 1 if unit in ONE_WORKER_MODULES else 2


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for tier in tiers_of(item.nodeid):
            item.add_marker(tier)


@pytest.hookimpl(optionalhook=True)     # a pytest-xdist hook: `-n N` runs this scheduler (none without -n)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each group of `xdist_group_of` is one unit of work, sent whole to one worker; every other test is its own
    unit. (xdist's `--dist loadgroup` would do it from `xdist_group` markers, but it renames node ids through an
    attribute pytest 9 no longer reads.) The longest units are handed out first, so that none starts near the end:
    the serial tiers, then the one-worker modules, then the other tests in their order."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid) or nodeid

        def _assign_work_unit(self, node: Any) -> None:
            if not getattr(self, "_ordered", False):        # once, on the first unit handed out
                ranked = sorted(self.workqueue.items(), key=lambda unit: _rank(unit[0]))    # stable: keeps order
                self.workqueue = OrderedDict(ranked)
                self._ordered = True
            super()._assign_work_unit(node)

    return GroupScheduling(config, log)


@pytest.fixture(autouse=True, scope="session")
def results_match_output_schemas() -> Any:
    """Every result of a tool method in this process is checked against the tool's outputSchema, closed
    (support/output_schemas.py): the output schemas describe every key a result can carry."""
    saved = output_schemas.install()
    yield
    output_schemas.uninstall(saved)


@pytest.fixture
def redis_url() -> str:
    return service_env("KEEL_REDIS_URL")


@pytest.fixture
def kafka_bootstrap() -> str:
    return service_env("KEEL_KAFKA_BOOTSTRAP")


@pytest.fixture
def root() -> Path:
    return ROOT


@pytest.fixture
def private_finance(tmp_path: Path) -> Path:
    """The finance cartridge copied under a name of its own: its Redis namespace, Kafka topics and worker group
    are this test's, so that tests on other pytest-xdist workers never meet its data or join its group."""
    from support.workers import unique_cartridge
    return unique_cartridge(tmp_path, "finance")
