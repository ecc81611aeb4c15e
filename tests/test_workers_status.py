"""`keel status` shaping without services."""
from __future__ import annotations

from aiokafka.partitioner import DefaultPartitioner

from keel.kafka import PartitionOffsets
from keel.wire import partition_for
from workers.status import render_status, shape_status


def test_partition_of_a_tenant_is_kafkas_default_partitioner() -> None:
    partitioner = DefaultPartitioner()
    parts = list(range(8))
    for tenant in ("hogar-demo", "salon-lucia", "tenant-00042", "a"):
        assert partition_for(tenant, 8) == partitioner(tenant.encode(), parts, parts)


def test_status_document() -> None:
    partitions = [PartitionOffsets(0, 10, 10, 0), PartitionOffsets(1, 7, None, 7)]
    doc = shape_status("finance", partitions, {"b": {1: None}, "a": {0: 9}}, {"a": 2, "": 1})
    assert doc["lag"] == 7
    assert doc["partitions"] == [{"partition": 0, "end": 10, "committed": 10, "lag": 0},
                                 {"partition": 1, "end": 7, "committed": None, "lag": 7}]
    assert list(doc["tenants"]) == ["a", "b"]
    assert doc["tenants"]["a"] == {"applied_offsets": {"0": 9}, "dead_letters": 2}
    assert doc["dead_letters"] == 3 and doc["dead_letters_without_tenant"] == 1
    text = render_status(doc)
    assert "keel.finance.events" in text and "lag 7" in text and "dead letters: 3" in text
