"""Shared test configuration: the `services` marker and access to real Kafka/Redis from the environment."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.services import service_env

ROOT = Path(__file__).resolve().parents[1]


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "services: needs real Kafka/Redis (KEEL_KAFKA_BOOTSTRAP, KEEL_REDIS_URL)")


@pytest.fixture
def redis_url() -> str:
    return service_env("KEEL_REDIS_URL")


@pytest.fixture
def kafka_bootstrap() -> str:
    return service_env("KEEL_KAFKA_BOOTSTRAP")


@pytest.fixture
def root() -> Path:
    return ROOT
