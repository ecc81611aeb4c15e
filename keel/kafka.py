"""The Kafka boundary shared by workers, publishing and ingress: aiokafka clients configured the way Keel needs them, topics, offsets, and the
translation of client errors into KeelError (nothing above this module sees an aiokafka exception)."""
from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError

from .errors import KafkaUnavailable
from .outages import KAFKA

TOPIC_CONFIG = {"message.timestamp.type": "LogAppendTime"}   # recorded_at of envelopes without one
_ALREADY_EXISTS = 36
_RETRIABLE_FOR = 10.0       # seconds a retriable error (a group coordinator being elected) is waited through
T = TypeVar("T")


@dataclass(frozen=True)
class TopicSpec:
    """How Keel creates a missing topic."""
    partitions: int = 8
    replication_factor: int = 1


@dataclass(frozen=True)
class PartitionOffsets:
    """One partition of a topic: log end, the group's committed offset (None: never committed), lag."""
    partition: int
    end: int
    committed: int | None
    lag: int
    metadata: str = ""       # what the committer stored with the offset (Keel's workers: who and when)


@dataclass(frozen=True)
class GroupMember:
    """A member of a consumer group, as the group coordinator describes it."""
    member_id: str
    client_id: str
    host: str
    partitions: tuple[int, ...]      # of the topic asked about


@dataclass(frozen=True)
class GroupDescription:
    state: str                        # Stable, PreparingRebalance, CompletingRebalance, Empty, Dead
    members: tuple[GroupMember, ...]


@asynccontextmanager
async def kafka_guard(what: str, bootstrap: str) -> AsyncIterator[None]:
    """Translate aiokafka/network errors into KafkaUnavailable, naming the operation and the bootstrap."""
    try:
        yield
    except KafkaError as e:
        raise KafkaUnavailable(f"Kafka {what} failed at {bootstrap}: {type(e).__name__}: {e}") from e
    except (TimeoutError, OSError) as e:
        raise KafkaUnavailable(f"Kafka {what} failed at {bootstrap}: {type(e).__name__}: {e}") from e
    KAFKA.ok()          # Kafka answered: a broker outage the clients were logging has ended (keel/outages.py)


async def retrying(call: Callable[[], Awaitable[T]], patience: float = _RETRIABLE_FOR) -> T:
    """`call()`, again after a retriable Kafka error (aiokafka's `retriable`: a coordinator not elected yet on a
    fresh cluster, a leader moving) until `patience` seconds have passed; other errors go straight up."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + patience
    delay = 0.1
    while True:
        try:
            return await call()
        except KafkaError as e:
            if not getattr(e, "retriable", False) or loop.time() + delay > deadline:
                raise
        await asyncio.sleep(delay)
        delay = min(delay * 2, 1.0)


def bootstrap_list(bootstrap: str) -> list[str]:
    return [b.strip().removeprefix("kafka://") for b in bootstrap.split(",") if b.strip()]


def new_producer(bootstrap: str, **options: object) -> AIOKafkaProducer:
    """An idempotent producer with acks=all: a record is acknowledged once every in-sync replica has it,
    and retries never reorder or duplicate records of one partition."""
    options.setdefault("linger_ms", 5)
    options.setdefault("max_batch_size", 512 * 1024)
    return AIOKafkaProducer(bootstrap_servers=bootstrap_list(bootstrap), acks="all", enable_idempotence=True,
                            client_id="keel", **options)  # type: ignore[arg-type]


def new_consumer(bootstrap: str, topic: str, group: str, **options: object) -> AIOKafkaConsumer:
    """A group consumer without auto-commit: the worker commits offsets itself, after the Redis write."""
    options.setdefault("max_partition_fetch_bytes", 4 << 20)
    options.setdefault("fetch_max_bytes", 64 << 20)
    options.setdefault("client_id", "keel-worker")
    return AIOKafkaConsumer(bootstrap_servers=bootstrap_list(bootstrap), group_id=group,
                            enable_auto_commit=False, auto_offset_reset="earliest",
                            isolation_level="read_committed", **options)  # type: ignore[arg-type]


@asynccontextmanager
async def admin_client(bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_list(bootstrap), client_id="keel-admin")
    async with kafka_guard("connect", bootstrap):
        await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


async def ensure_topics(bootstrap: str, topics: Sequence[str], spec: TopicSpec) -> dict[str, int]:
    """Create the topics that are missing (LogAppendTime); returns every topic's partition count."""
    async with admin_client(bootstrap) as admin:
        async with kafka_guard("list topics", bootstrap):      # (each request retried while one broker of several
            existing = set(await retrying(admin.list_topics))  # is down: its node is "not ready", issue 44)
        missing = [t for t in topics if t not in existing]
        if missing:
            async with kafka_guard("create topics", bootstrap):
                response = await retrying(lambda: admin.create_topics(
                    [NewTopic(t, spec.partitions, spec.replication_factor, topic_configs=dict(TOPIC_CONFIG))
                     for t in missing]))
            for err in response.to_object().get("topic_errors", []):
                if err["error_code"] not in (0, _ALREADY_EXISTS):
                    raise KafkaUnavailable(f"cannot create topic {err['topic']}: error {err['error_code']} "
                                           f"{err.get('error_message') or ''}".rstrip())
        return await _partition_counts(admin, bootstrap, topics)


async def _partition_counts(admin: AIOKafkaAdminClient, bootstrap: str, topics: Sequence[str]) -> dict[str, int]:
    # a new topic's metadata takes a moment to spread, and a broker that just died leads its partitions until the
    # controller notices (broker.session.timeout.ms, 9 s by default): wait up to 30 s for every leader
    for _ in range(300):
        async with kafka_guard("describe topics", bootstrap):
            described = await retrying(lambda: admin.describe_topics(topics))
        counts = {d["topic"]: len(d["partitions"]) for d in described if d["error_code"] == 0 and d["partitions"]
                  and all(p["leader"] >= 0 for p in d["partitions"])}
        if len(counts) == len(topics):
            return counts
        await asyncio.sleep(0.1)
    raise KafkaUnavailable(f"topics {', '.join(t for t in topics if t not in counts)} have no partition leaders")


async def topic_exists(bootstrap: str, topic: str) -> bool:
    async with admin_client(bootstrap) as admin, kafka_guard("list topics", bootstrap):
        return topic in set(await admin.list_topics())


async def topic_partitions(bootstrap: str, topic: str) -> list[TopicPartition]:
    """The partitions of a topic (none when it does not exist)."""
    async with admin_client(bootstrap) as admin, kafka_guard(f"describe {topic}", bootstrap):
        [described] = await admin.describe_topics([topic])
    return [TopicPartition(topic, p["partition"]) for p in described["partitions"]]


async def read_to_end(bootstrap: str, tps: Sequence[TopicPartition], client_id: str) -> AsyncIterator[Any]:
    """Every committed record of the partitions, from their beginning up to their end as it is when reading
    starts (no consumer group, nothing committed); partition by partition in offset order, interleaved."""
    if not tps:
        return
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_list(bootstrap), enable_auto_commit=False,
                                client_id=client_id, isolation_level="read_committed",
                                auto_offset_reset="earliest")    # else assign()'s own reset may race the seek
    topic = tps[0].topic
    async with kafka_guard(f"read {topic}", bootstrap):
        await consumer.start()
        try:
            consumer.assign(list(tps))
            ends = await consumer.end_offsets(list(tps))
            await consumer.seek_to_beginning(*tps)
            todo = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
            while todo:
                batch = await consumer.getmany(*todo, timeout_ms=1000)
                for tp, records in batch.items():
                    for r in records:
                        if r.offset < ends[tp]:
                            yield r
                todo = {tp for tp in todo if await consumer.position(tp) < ends[tp]}
        finally:
            await consumer.stop()


async def group_offsets(bootstrap: str, topic: str, group: str) -> list[PartitionOffsets]:
    """End and committed offsets of every partition of a topic for one consumer group."""
    async with admin_client(bootstrap) as admin:
        async with kafka_guard("describe topic", bootstrap):
            [described] = await admin.describe_topics([topic])
            committed = await retrying(lambda: admin.list_consumer_group_offsets(group))
        tps = [TopicPartition(topic, p["partition"]) for p in described["partitions"]]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_list(bootstrap), enable_auto_commit=False,
                                client_id="keel-status")
    async with kafka_guard("read offsets", bootstrap):
        await consumer.start()
        try:
            ends = await consumer.end_offsets(tps)
            starts = await consumer.beginning_offsets(tps)
        finally:
            await consumer.stop()
    out = []
    for tp in sorted(tps, key=lambda t: t.partition):
        meta = committed.get(tp)
        done = meta.offset if meta is not None and meta.offset >= 0 else None
        out.append(PartitionOffsets(tp.partition, ends[tp], done, ends[tp] - (starts[tp] if done is None else done),
                                    (meta.metadata or "") if meta is not None else ""))
    return out


async def describe_group(bootstrap: str, group: str, topic: str) -> GroupDescription:
    """The group's state and members, each with the partitions of `topic` assigned to it."""
    from aiokafka.coordinator.protocol import ConsumerProtocolMemberAssignment
    async with admin_client(bootstrap) as admin, kafka_guard("describe group", bootstrap):
        [response] = await retrying(lambda: admin.describe_consumer_groups([group]))
    members = []
    for g in response.groups:
        _error, _gid, state, *_rest = g
        for m in g[5]:
            member_id, client_id, host, _meta, raw = m[0], m[1], m[2], m[-2], m[-1]
            parts: tuple[int, ...] = ()
            if raw:
                assigned = ConsumerProtocolMemberAssignment.decode(raw)
                parts = tuple(sorted(p for t, ps in assigned.assignment if t == topic for p in ps))
            members.append(GroupMember(member_id, client_id, host, parts))
        return GroupDescription(state, tuple(members))
    return GroupDescription("Dead", ())
