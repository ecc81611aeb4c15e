"""Shared test configuration: the `services` marker and access to real Kafka/Redis from the environment."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "services: needs real Kafka/Redis (KEEL_KAFKA_BOOTSTRAP, KEEL_REDIS_URL)")


def service_env(name: str) -> str:
    """The value of a service variable; skip (or fail under `make test`) when it is missing."""
    value = os.environ.get(name)
    if value:
        return value
    if os.environ.get("KEEL_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{name} is not set but KEEL_REQUIRE_SERVICES=1 (run through `make test`)")
    pytest.skip(f"{name} not set: run `make test`, or `eval \"$(deploy/local/services up)\"` first")


@pytest.fixture
def redis_url() -> str:
    return service_env("KEEL_REDIS_URL")


@pytest.fixture
def kafka_bootstrap() -> str:
    return service_env("KEEL_KAFKA_BOOTSTRAP")


@pytest.fixture
def root() -> Path:
    return ROOT
