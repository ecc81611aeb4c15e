"""`keel.kafka.retrying`: a retriable Kafka error (a group coordinator still being elected on a fresh cluster)
is waited through; any other error, or one that outlasts the patience, reaches the caller unchanged."""
from __future__ import annotations

import asyncio

import pytest
from aiokafka.errors import (
    GroupCoordinatorNotAvailableError,
    UnknownTopicOrPartitionError,
    UnsupportedVersionError,
)

from keel.kafka import retrying


def test_a_retriable_error_is_waited_through() -> None:
    calls: list[int] = []

    async def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise GroupCoordinatorNotAvailableError()
        return "offsets"

    assert asyncio.run(retrying(flaky)) == "offsets"
    assert len(calls) == 3


def test_a_lasting_retriable_error_reaches_the_caller() -> None:
    calls: list[int] = []

    async def never() -> str:
        calls.append(1)
        raise UnknownTopicOrPartitionError()

    with pytest.raises(UnknownTopicOrPartitionError):
        asyncio.run(retrying(never, patience=0.5))
    assert 2 <= len(calls) <= 6


def test_a_non_retriable_error_is_not_retried() -> None:
    calls: list[int] = []

    async def broken() -> str:
        calls.append(1)
        raise UnsupportedVersionError()

    with pytest.raises(UnsupportedVersionError):
        asyncio.run(retrying(broken))
    assert calls == [1]
