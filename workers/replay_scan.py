"""Reading one partition of an events topic from its beginning, without a consumer group (a replay must not
move the workers' committed offsets), as Records. aiokafka errors become KafkaUnavailable here."""
from __future__ import annotations

from aiokafka import AIOKafkaConsumer, TopicPartition

from keel.errors import UsageError
from keel.kafka import admin_client, bootstrap_list, kafka_guard, topic_exists
from keel.wire import partition_for

from .records import Record


async def partition_count(bootstrap: str, topic: str) -> int:
    """Partitions of a topic (UsageError when it does not exist)."""
    if not await topic_exists(bootstrap, topic):
        raise UsageError(f"topic {topic} does not exist: nothing to replay (publish events or start a worker)")
    async with admin_client(bootstrap) as admin, kafka_guard("describe topic", bootstrap):
        [described] = await admin.describe_topics([topic])
    return len(described["partitions"])


async def end_offsets(bootstrap: str, topic: str, partitions: list[int]) -> dict[int, int]:
    """The end offset (last stable offset) of each partition now: the records a replay has ahead of it, for the
    progress bar's total before the first partition is read."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_list(bootstrap), group_id=None, client_id="keel-replay",
                                enable_auto_commit=False, isolation_level="read_committed")
    tps = [TopicPartition(topic, p) for p in partitions]
    async with kafka_guard("read end offsets", bootstrap):
        await consumer.start()
        try:
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
    return {tp.partition: ends[tp] for tp in tps}


def tenant_partition(tenant: str, partitions: int) -> int:
    """The partition holding a tenant's records (Kafka's default partitioner on key = tenant)."""
    return partition_for(tenant, partitions)


class PartitionScan:
    """Fetches the records of one partition in order, from its first offset; `end()` is the log end now."""

    def __init__(self, bootstrap: str, topic: str, partition: int, *, max_records: int = 20_000) -> None:
        self.bootstrap = bootstrap
        self.tp = TopicPartition(topic, partition)
        self.max_records = max_records
        self.consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_list(bootstrap), group_id=None,
                                         client_id="keel-replay", enable_auto_commit=False,
                                         auto_offset_reset="earliest", isolation_level="read_committed",
                                         max_partition_fetch_bytes=16 << 20, fetch_max_bytes=64 << 20)
        self.first = 0

    async def start(self) -> None:
        """Connect, and position at the partition's first offset; refuses a partition that lost records."""
        async with kafka_guard("start replay consumer", self.bootstrap):
            await self.consumer.start()
            self.consumer.assign([self.tp])
            self.first = (await self.consumer.beginning_offsets([self.tp]))[self.tp]
            await self.consumer.seek_to_beginning(self.tp)
        if self.first > 0:
            await self.consumer.stop()           # refused: close it here (the caller never gets to)
            raise UsageError(f"{self.tp.topic} partition {self.tp.partition} starts at offset {self.first}: older "
                             f"records were deleted (retention), so a replay would lose them. Keel's topics "
                             f"need retention.ms=-1")

    async def end(self) -> int:
        """The offset the next record will get (last stable offset, read_committed)."""
        async with kafka_guard("read end offset", self.bootstrap):
            return (await self.consumer.end_offsets([self.tp]))[self.tp]

    async def fetch(self, timeout_s: float = 0.5) -> list[Record]:
        async with kafka_guard("fetch", self.bootstrap):
            fetched = await self.consumer.getmany(self.tp, timeout_ms=int(timeout_s * 1000),
                                                  max_records=self.max_records)
        return [Record.of(r) for r in fetched.get(self.tp, ())]

    async def stop(self) -> None:
        async with kafka_guard("stop replay consumer", self.bootstrap):
            await self.consumer.stop()
