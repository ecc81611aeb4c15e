"""Keel's exceptions: one root, precise subclasses carrying the identifiers involved, and the exit code of
each family (every `keel` command exits with these; docs/exit-codes.md and docs/cli.md list them).

Client-library errors (redis-py, aiokafka, psycopg) are translated into ServiceUnavailable subclasses at
the boundary that calls the library (keel/store/redis/transport.py, keel/kafka.py, keel/ingress/outbox.py).
"""
from __future__ import annotations

EXIT_OK = 0
EXIT_DOMAIN = 1          # an answerable question with a negative answer, or a refused operation
EXIT_USAGE = 2           # bad arguments, a bad cartridge or bad input lines
EXIT_UNAVAILABLE = 3     # a service Keel needs is down or failing: Kafka, Redis, PostgreSQL
EXIT_INTERRUPTED = 130   # SIGINT


class KeelError(Exception):
    """Root of every error Keel raises on purpose."""


class UsageError(KeelError):
    """Bad arguments from a caller (CLI exit 2, MCP tool error)."""


class BadTime(UsageError):
    """A time that is neither RFC 3339 nor a date."""

    def __init__(self, value: object) -> None:
        super().__init__(f"bad time {value!r}: use RFC 3339 (2026-10-01T00:00:00Z) or a date (2026-10-01)")
        self.value = value


class CartridgeInvalid(KeelError):
    """A cartridge folder failed validation; `problems` holds one line per problem."""

    def __init__(self, path: str, problems: list[str]) -> None:
        super().__init__(f"cartridge {path} is invalid:\n" + "\n".join(f"  {p}" for p in problems))
        self.path = path
        self.problems = problems


class EnvelopeRejected(KeelError):
    """An event envelope failed a check; it is kept (dead letter or stderr line), never applied."""

    def __init__(self, reason: str, *, event_id: str | None = None, tenant: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.event_id = event_id
        self.tenant = tenant


class PersonalDataInClear(EnvelopeRejected):
    """An envelope whose personal fields (a cartridge's `personal:`) arrived in clear, and the cartridge does not
    accept them so (docs/privacy.md). `masked` is the envelope as JSON with those fields replaced by the mask:
    what a dead letter keeps, so the clear values are never stored. The reason names fields, never values."""

    def __init__(self, reason: str, *, masked: bytes, event_id: str | None = None,
                 tenant: str | None = None) -> None:
        super().__init__(reason, event_id=event_id, tenant=tenant)
        self.masked = masked


class VersionUnknown(EnvelopeRejected):
    """An envelope of a newer version of its event type than the cartridge knows (a producer deployed before
    the workers). File mode reports it like any refusal; a worker neither applies, dead-letters nor skips it:
    it stops the record's partition there until it runs a cartridge that knows the version."""

    def __init__(self, event_type: str, version: int, known: int, *, event_id: str | None = None,
                 tenant: str | None = None) -> None:
        super().__init__(f"{event_type} version {version} is newer than this cartridge knows (version {known}): "
                         f"run a cartridge that knows it", event_id=event_id, tenant=tenant)
        self.event_type = event_type
        self.version = version
        self.known = known


class HandlerFailed(KeelError):
    """A cartridge handler raised while applying an event; nothing of that event was written."""

    def __init__(self, event_id: str, tenant: str, event_type: str, cause: BaseException) -> None:
        super().__init__(f"handler for {event_type} failed on event {event_id} of tenant {tenant}: "
                         f"{type(cause).__name__}: {cause}")
        self.event_id = event_id
        self.tenant = tenant
        self.event_type = event_type


class DomainError(KeelError):
    """An answerable question with a negative answer (CLI exit 1)."""


class UnknownEntity(DomainError, LookupError):
    """The entity does not exist in the tenant's graph (at the asked knowledge time)."""

    def __init__(self, tenant: str, entity: str) -> None:
        super().__init__(f"unknown entity {entity!r} in tenant {tenant!r}; "
                         f"try `search` to find the right id")
        self.tenant = tenant
        self.entity = entity


class UnknownTenant(DomainError, LookupError):
    """No event of the tenant has been applied: nothing is known about it (a typo, or nothing ingested yet)."""

    def __init__(self, tenant: str) -> None:
        super().__init__(f"unknown tenant {tenant!r}: no event of it has been applied")
        self.tenant = tenant


class NoteRefused(DomainError, PermissionError):
    """annotate refused by the memory policy; nothing was written."""

    def __init__(self, reason: str, *, tenant: str, entity: str, scope: str) -> None:
        super().__init__(f"note on {entity!r} (scope {scope}, tenant {tenant!r}) refused: {reason}")
        self.tenant = tenant
        self.entity = entity
        self.scope = scope


class ServiceUnavailable(KeelError):
    """A service Keel needs (Kafka, Redis, PostgreSQL) could not be reached or failed a request (exit 3).
    `service` names it."""
    service = "a service"


class StoreUnavailable(ServiceUnavailable):
    """The backing store (Redis) could not be reached or answered with an error."""
    service = "Redis"

    def __init__(self, what: str, *, tenant: str | None = None) -> None:
        super().__init__(what)
        self.tenant = tenant


class StoreRefusingWrites(StoreUnavailable):
    """Redis answers but refuses writes: out of memory (maxmemory reached, policy noeviction), fewer replicas in
    sync than min-replicas-to-write (NOREPLICAS), a read-only replica, failing snapshots (MISCONF). Named as
    such (`refusal`, which the message starts with), not as the command that met it: Redis refuses even the
    reads queued in a MULTI, so the raw error ("Command # 1 (GET ...) of pipeline caused error") reads as if
    reads failed. Retried like any outage; a worker's readiness turns 503 at once, saying `refusal`."""

    REFUSING = "Redis out of memory: refusing writes"

    def __init__(self, what: str, *, refusal: str, tenant: str | None = None) -> None:
        super().__init__(what, tenant=tenant)
        self.refusal = refusal


class StateBehind(StoreUnavailable):
    """The store holds less of a partition than a writer saw it hold: Redis lost acknowledged writes (a
    failover to a replica that lagged, a restart from an old backup). Nothing of the refused write was
    applied; the writer must resume that partition from what the store holds (`stored`), not from where it
    was. `held` is the offset the writer saw applied, `stored` what the store holds now (None: nothing)."""

    def __init__(self, what: str, *, topic: str, partition: int, held: int, stored: int | None,
                 tenant: str | None = None) -> None:
        super().__init__(what, tenant=tenant)
        self.topic = topic
        self.partition = partition
        self.held = held
        self.stored = stored


class ColdTierUnavailable(StoreUnavailable):
    """The cold tier (PostgreSQL, `KEEL_COLD_DSN`) could not be reached, refused a statement, or lacks a piece of
    closed history that Redis says it holds (exit 3). Raised only by reads that need cold history: reads of the
    present never touch the cold tier. A StoreUnavailable: a worker waits and retries it as an outage."""
    service = "PostgreSQL (cold tier)"


class ColdTierNotConfigured(UsageError):
    """A namespace holds closed history in the cold tier, and this process was given no cold tier
    (`KEEL_COLD_DSN` / `--cold-dsn`): it cannot read or drop that history (exit 2)."""

    def __init__(self, namespace: str, tenant: str | None = None) -> None:
        whose = f"tenant {tenant!r} of namespace {namespace!r}" if tenant else f"namespace {namespace!r}"
        super().__init__(f"{whose} keeps closed history in the cold tier (PostgreSQL): give it with "
                         f"KEEL_COLD_DSN or --cold-dsn")
        self.namespace = namespace
        self.tenant = tenant


class KafkaUnavailable(ServiceUnavailable):
    """Kafka could not be reached, refused a request, or did not acknowledge records in time."""
    service = "Kafka"


class WriteTimeout(KeelError):
    """A write was sent to the log but the projection did not show it in time."""

    def __init__(self, event_id: str, tenant: str, seconds: float) -> None:
        super().__init__(f"event {event_id} of tenant {tenant!r} was written to the log but not applied "
                         f"within {seconds:g}s; is a worker running? (`keel status`)")
        self.event_id = event_id
        self.tenant = tenant
