"""A cartridge checked against a whole log: every line of a JSONL events file, or every record of the cartridge's
events topic (each partition from its first offset to its end when the check began, no consumer group, so
the workers' offsets never move). Each envelope is parsed, upcast and projected by one or more cartridges into
in-memory graphs (`LogBuild`), as the workers would: on Kafka recorded_at defaults to the record's time and a
record whose key is not the envelope's tenant is refused. `keel validate --events/--kafka` and `keel diff`
read logs through here.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition

from .cartridge import Cartridge
from .embedded import BOM, bulk_allocation, open_events
from .envelope import in_a_file
from .errors import EnvelopeRejected, HandlerFailed, UsageError
from .kafka import admin_client, bootstrap_list, kafka_guard, topic_exists
from .projector import Projector
from .store.memory import MemoryStore
from .times import Micros, format_time


@dataclass(frozen=True)
class Entry:
    """One envelope of a log: where it is (`line 12`, `partition 3 offset 17`), its bytes (None: an empty
    record), the time Keel learned it (a record's timestamp; None in a file) and, for a record, its key."""
    where: str
    raw: bytes | None
    recorded_at: Micros | None = None
    keyed: bool = False         # a record: its key must be the envelope's tenant
    key: bytes | None = None
    origin: str = ""            # as kept with the event id: `at line 12`, `at <topic> partition 3 offset 17`


@dataclass(frozen=True)
class Refusal:
    where: str
    event_id: str | None
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: event {self.event_id or '?'}: {self.reason}"


@dataclass
class LogBuild:
    """One cartridge's graphs of a log, in memory, with what it refused and where."""
    cartridge: Cartridge
    check_upcasters: bool = False       # each Python upcaster runs twice per event and must agree
    applied: int = 0
    duplicates: int = 0
    refused: list[Refusal] = field(default_factory=list)
    clamped: list[Refusal] = field(default_factory=list)   # applied with recorded_at raised to the tenant's latest
    tenants: set[str] = field(default_factory=set)
    applied_ids: dict[str, set[str]] = field(default_factory=dict)     # tenant -> ids applied (not duplicates)
    reveal: Callable[[bytes], bytes] | None = None      # decrypts a sealed envelope's personal fields (privacy)

    def __post_init__(self) -> None:
        self.projector = Projector(self.cartridge, MemoryStore(), allow_global_notes=True,
                                   check_upcasters=self.check_upcasters)

    @property
    def store(self) -> MemoryStore:
        store = self.projector.store
        assert isinstance(store, MemoryStore)
        return store

    def apply(self, entry: Entry) -> None:
        """Parse (upcasting), check the record key, project; a refusal is kept with where it is."""
        try:
            if entry.raw is None:
                raise EnvelopeRejected("empty record: the value must be an event envelope")
            raw = entry.raw if self.reveal is None else self.reveal(entry.raw)
            event = self.projector.parse(raw, default_recorded_at=entry.recorded_at)
            if entry.keyed and entry.key != event.tenant.encode():
                shown = None if entry.key is None else entry.key.decode("utf-8", "replace")
                raise EnvelopeRejected(f"record key {shown!r} is not the envelope's tenant {event.tenant!r} "
                                       f"(Keel's topics are keyed by tenant)", event_id=event.id)
            outcome = self.projector.apply(event, entry.origin or None)
        except (EnvelopeRejected, HandlerFailed) as e:
            self.refused.append(Refusal(entry.where, e.event_id,
                                        in_a_file(e.reason) if isinstance(e, EnvelopeRejected) and
                                        entry.where.startswith("line ") else
                                        e.reason if isinstance(e, EnvelopeRejected) else str(e)))
            return
        self.tenants.add(event.tenant)
        if event.clamped_from is not None:
            self.clamped.append(Refusal(entry.where, event.id, (
                f"recorded_at {format_time(event.clamped_from)} is earlier than the tenant's latest; taken as "
                f"recorded at {format_time(event.recorded_at)}")))
        if outcome == "applied":
            self.applied += 1
            self.applied_ids.setdefault(event.tenant, set()).add(event.id)
        else:
            self.duplicates += 1


def read_file(path: str | Path, builds: list[LogBuild]) -> int:
    """Apply every line of an events file to each build, in order; returns the lines read (blank ones too, as
    `wc -l` counts)."""
    lines = 0
    with open_events(path) as f, bulk_allocation():
        for number, raw in enumerate(f, 1):
            lines = number
            if number == 1 and raw.startswith(BOM):     # a UTF-8 byte-order mark some editors write
                raw = raw[len(BOM):]
            if raw.isspace() or not raw:
                continue
            entry = Entry(f"line {number}", raw, origin=f"at line {number}")
            for build in builds:
                build.apply(entry)
    return lines


def read_topic(bootstrap: str, topic: str, builds: list[LogBuild]) -> int:
    """Apply every record of `topic` (partition by partition, each in order, up to its end when the read
    began) to each build; returns the records read. UsageError when the topic does not exist or lost its
    oldest records; KafkaUnavailable when Kafka cannot be read."""
    def apply(records: list[Entry]) -> None:
        for entry in records:
            for build in builds:
                build.apply(entry)
    with bulk_allocation():
        return asyncio.run(_read_topic(bootstrap, topic, apply))


async def _read_topic(bootstrap: str, topic: str, apply: Callable[[list[Entry]], None]) -> int:
    if not await topic_exists(bootstrap, topic):
        raise UsageError(f"topic {topic} does not exist at {bootstrap}: nothing to check (publish events or "
                         f"start a worker first)")
    async with admin_client(bootstrap) as admin, kafka_guard("describe topic", bootstrap):
        [described] = await admin.describe_topics([topic])
    tps = [TopicPartition(topic, p["partition"]) for p in sorted(described["partitions"],
                                                                  key=lambda p: p["partition"])]
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_list(bootstrap), group_id=None,
                                client_id="keel-check", enable_auto_commit=False, auto_offset_reset="earliest",
                                isolation_level="read_committed", max_partition_fetch_bytes=16 << 20)
    read = 0
    async with kafka_guard("read the topic", bootstrap):
        await consumer.start()
        try:
            consumer.assign(tps)
            starts = await consumer.beginning_offsets(tps)
            ends = await consumer.end_offsets(tps)
            lost = [tp.partition for tp in tps if starts[tp] > 0]
            if lost:
                raise UsageError(f"{topic} partition(s) {lost} lost their oldest records (retention): the whole "
                                 f"log cannot be checked. Keel's topics need retention.ms=-1")
            for tp in tps:
                if ends[tp] == 0:
                    continue
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                while await consumer.position(tp) < ends[tp]:     # (the position passes transaction markers)
                    fetched = await consumer.getmany(tp, timeout_ms=1000, max_records=20_000)
                    records = [r for r in fetched.get(tp, ()) if r.offset < ends[tp]]
                    apply([_entry(r) for r in records])
                    read += len(records)
        finally:
            await consumer.stop()
    return read


def _entry(r: Any) -> Entry:
    """An aiokafka ConsumerRecord as an Entry (its LogAppendTime in micros: the default recorded_at)."""
    t = r.timestamp
    where = f"partition {r.partition} offset {r.offset}"
    return Entry(where, r.value, t * 1000 if t is not None and t >= 0 else None, True, r.key,
                 origin=f"at {r.topic} {where}")
