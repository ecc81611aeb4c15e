"""Errors raised by the ingress paths; every client-library error is translated at its boundary."""
from __future__ import annotations

from keel.errors import KafkaUnavailable, KeelError, StoreUnavailable, UsageError

__all__ = ["KafkaUnavailable", "ListenFailed", "OutboxMissing", "OutboxUnavailable", "SecretsInvalid"]


class OutboxUnavailable(StoreUnavailable):
    """PostgreSQL (the outbox database) could not be reached or refused a statement."""


class OutboxMissing(UsageError):
    """The outbox or its cursor table does not exist: run `keel outbox init` first."""


class SecretsInvalid(UsageError):
    """The webhook's secrets file is missing, unreadable or malformed."""


class ListenFailed(KeelError):
    """The webhook could not listen on the asked address (port in use, no permission)."""
