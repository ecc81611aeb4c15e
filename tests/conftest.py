"""Shared test configuration: the slow tiers' markers, given by path, and access to real Kafka/Redis from the
environment. Every marker is declared in pyproject.toml ([tool.pytest.ini_options] markers)."""
from __future__ import annotations

from pathlib import Path

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
    # layout 2 closing a segment after every step, its random writes against the memory store: minutes each
    "rolling_segments": ("tests/test_store_redis.py::TestSegmentStoreRollingEveryStep::test_random_writes",
                         "tests/test_redis_cluster.py::TestRedisClusterSegmentStore::test_random_writes"),
}


def tiers_of(nodeid: str) -> list[str]:
    """The slow tiers of a test, by its node id (most tests are in none)."""
    return [tier for tier, places in TIERS.items() if nodeid.startswith(places)]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        for tier in tiers_of(item.nodeid):
            item.add_marker(tier)


@pytest.fixture
def redis_url() -> str:
    return service_env("KEEL_REDIS_URL")


@pytest.fixture
def kafka_bootstrap() -> str:
    return service_env("KEEL_KAFKA_BOOTSTRAP")


@pytest.fixture
def root() -> Path:
    return ROOT
