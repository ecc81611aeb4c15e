"""Prometheus series and health state of the ingress processes (outbox relay, webhook).

Labels are cartridges, HTTP statuses and outcomes: never a tenant, so cardinality stays fixed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from keel.health import Health

BATCH_BUCKETS = (1, 10, 50, 100, 250, 500, 1000, 2000, 5000, 10000)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class RelayMetrics:
    def __init__(self, registry: CollectorRegistry, cartridge: str) -> None:
        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, ["cartridge", *labels], registry=registry)
        self.relayed = counter("keel_relay_events_relayed", "Outbox rows produced to the events topic.") \
            .labels(cartridge)
        self.dead_lettered = counter("keel_relay_events_dead_lettered", "Outbox rows sent to the dead-letter "
                                     "topic.").labels(cartridge)
        errors = counter("keel_relay_errors", "Outages of PostgreSQL or Kafka (the relay retries).", "system")
        self.postgres_errors = errors.labels(cartridge, "postgres")
        self.kafka_errors = errors.labels(cartridge, "kafka")
        self.batch_size = Histogram("keel_relay_batch_size", "Rows per relayed step.", ["cartridge"],
                                    buckets=BATCH_BUCKETS, registry=registry).labels(cartridge)
        self.commit_latency = Histogram("keel_relay_commit_latency_seconds", "From producing a step to its "
                                        "cursor stored (Kafka acknowledgement + cursor write).", ["cartridge"],
                                        buckets=LATENCY_BUCKETS, registry=registry).labels(cartridge)
        self.active = Gauge("keel_relay_active", "1 while this relay holds the lock and relays, 0 while it "
                            "stands by or reconnects.", ["cartridge"], registry=registry).labels(cartridge)


class WebhookMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Counter("keel_webhook_requests", "Requests by cartridge (path) and HTTP status.",
                                ["cartridge", "status"], registry=registry)
        self.events = Counter("keel_webhook_events", "Envelopes by outcome: accepted, rejected, duplicate.",
                              ["cartridge", "outcome"], registry=registry)
        self.latency = Histogram("keel_webhook_request_latency_seconds", "Time to answer a POST (Kafka "
                                 "acknowledgement included).", buckets=LATENCY_BUCKETS, registry=registry)
        self.kafka_errors = Counter("keel_webhook_kafka_errors", "Batches Kafka did not acknowledge (503).",
                                    registry=registry)


@dataclass
class Probes:
    """The process's registry, its health and the readiness flags its loops set."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    health: Health = field(default_factory=Health)
    down: dict[str, str | None] = field(default_factory=dict)   # system -> why it is unreachable (None: fine)

    def watch(self, system: str, initially: str = "not connected yet") -> None:
        """A readiness check that follows the flag of `system` (set with reachable / unreachable)."""
        self.down[system] = initially
        self.health.check(system, lambda: self.down.get(system))

    def reachable(self, system: str) -> None:
        self.down[system] = None

    def unreachable(self, system: str, why: object) -> None:
        self.down[system] = str(why) or type(why).__name__
