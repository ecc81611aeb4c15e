"""Access to the real services (Kafka, Redis, PostgreSQL) named by the environment, for tests and helpers."""
from __future__ import annotations

import os

import pytest


def service_env(name: str) -> str:
    """The value of a service variable; skip (or fail under `make test`) when it is missing."""
    value = os.environ.get(name)
    if value:
        return value
    if os.environ.get("KEEL_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{name} is not set but KEEL_REQUIRE_SERVICES=1 (run through `make test`)")
    pytest.skip(f"{name} not set: run `make test`, or `eval \"$(deploy/local/services up)\"` first")
