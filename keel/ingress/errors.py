"""Errors raised by the ingress paths; every client-library error is translated at its boundary."""
from __future__ import annotations

from keel.errors import DomainError, KafkaUnavailable, KeelError, StoreUnavailable, UsageError

__all__ = ["KafkaUnavailable", "ListenFailed", "OutboxMissing", "OutboxUnavailable", "RelayBusy", "SecretsInvalid"]


class OutboxUnavailable(StoreUnavailable):
    """PostgreSQL (the outbox database) could not be reached or refused a statement."""
    service = "PostgreSQL"


class RelayBusy(DomainError):
    """`--once` found another relay of the same name holding the outbox (exit 1: nothing is down)."""

    def __init__(self, name: str, tables: object) -> None:
        super().__init__(f"another relay named {name!r} is running on {tables}")
        self.name = name


class OutboxMissing(UsageError):
    """The outbox or its cursor table does not exist: run `keel outbox init` first."""


class SecretsInvalid(UsageError):
    """The webhook's secrets file is missing, unreadable or malformed."""


class ListenFailed(KeelError):
    """The webhook could not listen on the asked address (port in use, no permission)."""
