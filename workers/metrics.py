"""The Prometheus series of a worker process (prometheus_client, one registry per process).

Labels are the cartridge and, for lag, the partition: never a tenant, so cardinality stays fixed.
"""
from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

BATCH_BUCKETS = (1, 10, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 25000)
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class WorkerMetrics:
    """Counters, histograms and gauges of the ingest services of one worker process."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.applied = Counter("keel_worker_events_applied", "Events applied to Redis, per cartridge.",
                               ["cartridge"], registry=registry)
        self.dead_lettered = Counter("keel_worker_events_dead_lettered",
                                     "Records sent to the dead-letter topic, per cartridge.", ["cartridge"],
                                     registry=registry)
        self.records = Counter("keel_worker_records", "Records consumed and written (applied, duplicate, "
                               "skipped or dead-lettered), per cartridge.", ["cartridge"], registry=registry)
        self.batch_size = Histogram("keel_worker_batch_size", "Records per written batch.", ["cartridge"],
                                    buckets=BATCH_BUCKETS, registry=registry)
        self.commit_latency = Histogram("keel_worker_commit_latency_seconds",
                                        "Time to write a planned batch (dead letters, Redis) and commit its "
                                        "Kafka offsets.", ["cartridge"], buckets=LATENCY_BUCKETS, registry=registry)
        self.lag = Gauge("keel_worker_partition_lag", "Records of the partition not yet written by this worker "
                         "(log end minus the next offset to write), per assigned partition.",
                         ["cartridge", "partition"], registry=registry)
        self.assigned = Gauge("keel_worker_assigned_partitions", "Partitions assigned to this worker.",
                              ["cartridge"], registry=registry)
        self.rebalances = Counter("keel_worker_rebalances", "Partition assignments received (rebalances).",
                                  ["cartridge"], registry=registry)
        self.redis_errors = Counter("keel_worker_redis_errors", "Redis operations that failed (retried).",
                                    ["cartridge"], registry=registry)
        self.kafka_errors = Counter("keel_worker_kafka_errors", "Kafka operations that failed (fetch, dead "
                                    "letters, offset commit).", ["cartridge"], registry=registry)

        self.ready = Gauge("keel_worker_ready", "1 while the worker's readiness checks pass (/readyz 200), else 0.",
                           ["cartridge"], registry=registry)
        self.redis_behind = Gauge("keel_worker_redis_behind_records", "Records the consumer group's committed offset "
                                  "was ahead of what Redis holds when the partition was assigned or Redis was "
                                  "found to have lost writes (a failover, an old backup), counting down as they "
                                  "are re-applied; 0 once repaired. Its own figure: the lag (log end minus the "
                                  "commit) does not show it.",
                                  ["cartridge", "partition"], registry=registry)
        self.since_commit = Gauge("keel_worker_seconds_since_commit", "Seconds since the worker last committed a "
                                  "batch or found its partitions caught up: grows while it cannot write (Redis "
                                  "refusing writes, Kafka unreachable).", ["cartridge"], registry=registry)
        self.state_losses = Counter("keel_worker_redis_state_losses", "Times Redis was found holding less than "
                                    "this worker had written (lost acknowledged writes); each one rewinds the "
                                    "partitions to what Redis holds.", ["cartridge"], registry=registry)

    def of(self, cartridge: str) -> CartridgeMetrics:
        return CartridgeMetrics(self, cartridge)


class CartridgeMetrics:
    """The series of one cartridge (label bound once)."""

    def __init__(self, m: WorkerMetrics, cartridge: str) -> None:
        self.m = m
        self.cartridge = cartridge
        self.applied = m.applied.labels(cartridge)
        self.dead_lettered = m.dead_lettered.labels(cartridge)
        self.records = m.records.labels(cartridge)
        self.batch_size = m.batch_size.labels(cartridge)
        self.commit_latency = m.commit_latency.labels(cartridge)
        self.assigned = m.assigned.labels(cartridge)
        self.rebalances = m.rebalances.labels(cartridge)
        self.redis_errors = m.redis_errors.labels(cartridge)
        self.kafka_errors = m.kafka_errors.labels(cartridge)
        self.ready = m.ready.labels(cartridge)
        self.since_commit = m.since_commit.labels(cartridge)
        self.state_losses = m.state_losses.labels(cartridge)

    def redis_behind(self, partition: int, records: int) -> None:
        self.m.redis_behind.labels(self.cartridge, str(partition)).set(max(records, 0))

    def drop_redis_behind(self, partition: int) -> None:
        try:
            self.m.redis_behind.remove(self.cartridge, str(partition))
        except KeyError:
            return

    def lag(self, partition: int, value: int) -> None:
        self.m.lag.labels(self.cartridge, str(partition)).set(max(value, 0))

    def drop_lag(self, partition: int) -> None:
        try:
            self.m.lag.remove(self.cartridge, str(partition))
        except KeyError:
            return
