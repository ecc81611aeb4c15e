"""Where `keel cdc relay` is: its consumer group's committed offset on every change topic partition, the
partition's end and the lag between them (`keel cdc status`, and the `cdc` part of `keel status` for a cartridge
with `sources:`). Read with Kafka's admin API only: nothing joins the group."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from keel.kafka import bootstrap_list, kafka_guard


def relay_group(name: str) -> str:
    """The consumer group of the relay named `name` (default: the cartridge's name)."""
    return f"keel-cdc-{name}"


@dataclass(frozen=True)
class PartitionLag:
    topic: str
    partition: int
    committed: int | None
    end: int

    @property
    def lag(self) -> int:
        return self.end - (self.committed or 0)


async def relay_position(bootstrap: str, topics: Sequence[str] | None, group: str) -> list[PartitionLag]:
    """The relay's committed position and lag on every partition of `topics` (None: the partitions the group
    has committed offsets for, so no topic prefix is needed)."""
    from aiokafka.admin import AIOKafkaAdminClient
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_list(bootstrap), client_id="keel-cdc-status")
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_list(bootstrap), enable_auto_commit=False,
                                client_id="keel-cdc-status")
    async with kafka_guard("read the cdc relay's position", bootstrap):
        await admin.start()
        await consumer.start()
        try:
            if topics is None:
                committed = await admin.list_consumer_group_offsets(group)
                partitions = sorted(committed, key=lambda tp: (tp.topic, tp.partition))
            else:
                existing = set(await admin.list_topics())
                partitions = [TopicPartition(t, p) for t in topics if t in existing
                              for p in sorted(consumer.partitions_for_topic(t) or await _partitions(consumer, t))]
                committed = await admin.list_consumer_group_offsets(group, partitions=partitions) \
                    if partitions else {}
            ends = await consumer.end_offsets(partitions) if partitions else {}
        finally:
            await consumer.stop()
            await admin.close()
    out = []
    for tp in partitions:
        meta = committed.get(tp)
        offset = meta.offset if meta is not None and meta.offset >= 0 else None
        out.append(PartitionLag(tp.topic, tp.partition, offset, ends[tp]))
    return out


def position_doc(group: str, rows: Sequence[PartitionLag], topics: Sequence[str] | None = None) -> dict[str, Any]:
    """The JSON form: the group, the total lag, each partition, and the change topics that do not exist yet."""
    doc: dict[str, Any] = {"group": group, "lag": sum(r.lag for r in rows), "partitions": [
        {"topic": r.topic, "partition": r.partition, "committed": r.committed, "end": r.end, "lag": r.lag}
        for r in rows]}
    if topics is not None:
        doc["missing_topics"] = sorted(set(topics) - {r.topic for r in rows})
    return doc


def render_position(doc: dict[str, Any]) -> list[str]:
    if doc.get("unavailable"):
        return [f"cdc relay {doc['group']}: CANNOT READ its position: {doc['unavailable']}"]
    lines = [f"cdc relay {doc['group']}: lag {doc['lag']} change(s) on {len(doc['partitions'])} change topic "
             f"partition(s)" if doc["partitions"] else f"cdc relay {doc['group']}: no committed position yet"]
    for p in doc["partitions"]:
        committed = "none" if p["committed"] is None else str(p["committed"])
        lines.append(f"  {p['topic']}[{p['partition']}]: committed {committed}, end {p['end']}, lag {p['lag']}")
    for t in doc.get("missing_topics", []):
        lines.append(f"  {t}: no such topic yet (Debezium creates it at the table's first change)")
    return lines


async def _partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    await consumer._client.force_metadata_update()   # aiokafka has no public metadata refresh
    return consumer.partitions_for_topic(topic) or set()


def status_part(cartridge_name: str, bootstrap: str, timeout_s: float) -> dict[str, Any]:
    """The `cdc` part of `keel status` for a cartridge with `sources:`: the relay's position by its group (no
    prefix needed), or why it could not be read."""
    import asyncio

    from keel.errors import KafkaUnavailable
    group = relay_group(cartridge_name)
    try:
        rows = asyncio.run(asyncio.wait_for(relay_position(bootstrap, None, group), timeout_s))
    except (KafkaUnavailable, TimeoutError) as e:
        return {"group": group, "lag": None, "partitions": [], "unavailable": str(e) or f"no answer within "
                f"{timeout_s:.0f}s"}
    return position_doc(group, rows)
