"""Issue 44: `keel status`'s lag is the log end minus the group's commit; after a failover to a lagging replica the
commit is ahead of Redis and lag says 0. Redis behind the log is its own figure: in status (`redis_behind`, and
the text's first line) and in metrics (keel_worker_redis_behind_records, counting down while re-applied; the
alert rules read it: deploy/prometheus, tested by tests/test_alert_rules.py)."""
from __future__ import annotations

import logging

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry

from keel.kafka import PartitionOffsets
from workers.metrics import WorkerMetrics
from workers.positioning import Positions
from workers.status import RedisPart, render_status, shape_status

NOW = 1_800_000_000.0


def test_status_says_redis_behind_the_log_where_lag_is_zero() -> None:
    partitions = [PartitionOffsets(0, 100, 100, 0), PartitionOffsets(1, 90, 90, 0)]      # lag 0 everywhere
    redis = RedisPart(watermarks={0: 59, 1: 79}, holds_data=True, predates_watermarks=False)
    doc = shape_status("finance", partitions, None, {}, None, None, {}, now=NOW, redis=redis)
    assert doc["lag"] == 0 and doc["redis_behind"] == 40 + 10
    assert render_status(doc).splitlines()[0].endswith("lag 0  Redis behind the log 50")
    caught_up = RedisPart(watermarks={0: 99, 1: 89}, holds_data=True, predates_watermarks=False)
    doc = shape_status("finance", partitions, None, {}, None, None, {}, now=NOW, redis=caught_up)
    assert doc["redis_behind"] == 0 and "Redis behind" not in render_status(doc)
    unread = shape_status("finance", partitions, None, {}, None, None, {"redis": "down"}, now=NOW)
    assert unread["redis_behind"] is None                                   # unknown, not 0


def value(registry: CollectorRegistry, partition: int) -> float | None:
    return registry.get_sample_value("keel_worker_redis_behind_records", {"cartridge": "finance",
                                                                         "partition": str(partition)})


def test_the_gauge_counts_down_while_re_applied_and_is_zero_when_repaired() -> None:
    registry = CollectorRegistry()
    metrics = WorkerMetrics(registry).of("finance")
    positions = Positions(None, "keel.finance.events", log=logging.getLogger("test"), label="test",  # type: ignore[arg-type]
                          metrics=metrics, bootstrap="-", on_outage=lambda e: None)
    tp = TopicPartition("keel.finance.events", 3)
    positions.behind[tp] = 1000                   # found at its positioning: Redis must reach offset 1000
    metrics.redis_behind(3, 400)                  # Redis held through 599
    positions.repaired({("keel.finance.events", 3): 799})
    assert value(registry, 3) == 200
    positions.repaired({("keel.finance.events", 3): 999})
    assert value(registry, 3) == 0 and tp not in positions.behind
