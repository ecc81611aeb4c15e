"""Shared test configuration: the slow tiers' markers, given by path, and access to real Kafka/Redis from the
environment. Every marker is declared in pyproject.toml ([tool.pytest.ini_options] markers)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.services import service_env

ROOT = Path(__file__).resolve().parents[1]


# The slow tiers, each a marker given to the tests whose node id starts with one of its places: `make test-fast`
# leaves them out (SLOW_TIERS in the Makefile), `make test` runs every tier. A test added under one of these
# places joins its tier; tests/test_tiers.py keeps this table, pyproject.toml's markers and the Makefile agreeing.
TIERS = {
    "faults": ("tests/faults/",),
    "deploy": ("tests/deploy/",),
    "rebalance": ("tests/test_workers_rebalance.py",),
    # the Redis store closing a segment after every step, its random writes against the memory store: minutes each
    "rolling_segments": ("tests/test_store_redis.py::TestRedisStoreRollingEveryStep::test_random_writes",
                         "tests/test_redis_cluster.py::TestRedisClusterStore::test_random_writes"),
}


def tiers_of(nodeid: str) -> list[str]:
    """The slow tiers of a test, by its node id (most tests are in none)."""
    return [tier for tier, places in TIERS.items() if nodeid.startswith(places)]


# `make test` runs the suite on several pytest-xdist workers. Tests share nothing (each uses its own namespaces,
# topics, schemas, ports and tmp_path), except these, each group kept on one worker:
# - the serial tiers, one test after the other: they stop and restart services, run groups of worker processes
#   through rebalances, or run the stack in containers;
SERIAL_TIERS = ("faults", "deploy", "rebalance")
# - the modules whose module-scoped fixture starts something costly (Keycloak, a browser, a served graph), so
#   that it starts once rather than once per worker.
ONE_WORKER_MODULES = ("tests/test_oauth_keycloak.py", "tests/test_inspector_browser.py", "tests/test_inspector.py",
                      "tests/test_mcp_http.py", "tests/test_oauth.py")


def xdist_group_of(nodeid: str) -> str | None:
    """The group of a test whose tests run on one pytest-xdist worker (None: any worker, beside any test)."""
    if any(tier in SERIAL_TIERS for tier in tiers_of(nodeid)):
        return "serial_tiers"
    module = nodeid.split("::")[0]
    return module if module in ONE_WORKER_MODULES else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for tier in tiers_of(item.nodeid):
            item.add_marker(tier)


@pytest.hookimpl(optionalhook=True)     # a pytest-xdist hook: `-n N` runs this scheduler (none without -n)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Each group of `xdist_group_of` is one unit of work, sent whole to one worker; every other test is its own
    unit. (xdist's `--dist loadgroup` would do it from `xdist_group` markers, but it renames node ids through an
    attribute pytest 9 no longer reads.) The largest units are handed out first: the serial tiers start early."""
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid) or nodeid

    return GroupScheduling(config, log)


@pytest.fixture
def redis_url() -> str:
    return service_env("KEEL_REDIS_URL")


@pytest.fixture
def kafka_bootstrap() -> str:
    return service_env("KEEL_KAFKA_BOOTSTRAP")


@pytest.fixture
def root() -> Path:
    return ROOT
