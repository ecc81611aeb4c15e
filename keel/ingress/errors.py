"""Errors raised by the ingress paths; every client-library error is translated at its boundary."""
from __future__ import annotations

from keel.errors import KeelError, StoreUnavailable, UsageError


class OutboxUnavailable(StoreUnavailable):
    """PostgreSQL (the outbox database) could not be reached or refused a statement."""


class OutboxMissing(UsageError):
    """The outbox or its cursor table does not exist: run `keel outbox init` first."""


class KafkaUnavailable(KeelError):
    """Kafka could not be reached, or did not acknowledge records in time."""


class SecretsInvalid(UsageError):
    """The webhook's secrets file is missing, unreadable or malformed."""


class ListenFailed(KeelError):
    """The webhook could not listen on the asked address (port in use, no permission)."""
