"""`keel cdc relay`: Debezium's change topics → the cartridge's events topic, mapped by its `sources:`.

One step: take up to `batch` change records from the change topics (a Kafka consumer group, offsets committed by
hand), decode each (cdc_decode.py), map it with the cartridge's `sources:` (keel/sources.py), check every envelope
with the catalog, seal its personal fields (sealing.py) and produce it (key = tenant, acks=all); a change that
cannot map goes to the dead-letter topic with the reason and its position (table, LSN, sequence, transaction,
and the change topic's partition and offset; never the row's values); then, once Kafka acknowledged them all,
commit the step's offsets. A crash between the acknowledgement and the commit re-reads that step: ids derive from
the change's position (keel/sources.py), so the same change becomes the same envelope and Keel's dedupe counts it
once. A change that maps to nothing (no entry takes its operation, no condition holds, a tombstone) is counted.

`recorded_at` is the commit time of the change's transaction (a snapshot's read time for snapshot rows).
"""
from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import CommitFailedError, KafkaError

from keel.cartridge import Cartridge
from keel.envelope import Catalog
from keel.errors import EnvelopeRejected, KafkaUnavailable, StoreUnavailable
from keel.health import Health
from keel.identifiers import TENANT
from keel.kafka import TopicSpec, bootstrap_list, kafka_guard
from keel.source_mapping import map_change, source_for_table
from keel.sources import CompiledSource, Unmappable, compile_sources
from keel.times import format_time
from keel.wire import canonical_bytes

from .cdc_decode import Skipped, Undecodable, decode_change, position_of
from .encode import Encoded
from .metrics import Probes
from .producer import KafkaSink
from .records import OutRecord, dead_letter, event_record
from .sealing import IngressSealing

Log = Callable[[str], None]
BEAT = "cdc"
ONCE_WAIT_S = 15.0            # `--once`: how long to wait for a change topic to exist at all


@dataclass(frozen=True)
class CdcOptions:
    prefix: str                     # Debezium's topic.prefix: change topics are <prefix>.<schema>.<table>
    name: str                       # the consumer group is keel-cdc-<name>
    batch: int = 2000               # change records per step
    poll_ms: int = 200              # longest wait for records when idle
    progress_s: float = 10.0
    once: bool = False              # relay what the change topics hold now, then exit

    @property
    def group(self) -> str:
        return f"keel-cdc-{self.name}"


def change_topics(cartridge: Cartridge, prefix: str) -> list[str]:
    """The change topics of the tables the cartridge maps (Debezium's <topic.prefix>.<schema>.<table>)."""
    sources, _ = compile_sources(cartridge.spec)
    return sorted(f"{prefix}.{s.spec.table}" for s in sources.values())


@dataclass
class CdcEncoded(Encoded):
    """A step's records, as the outbox relay counts them, and the changes the cartridge maps to nothing."""
    unmapped: int = 0


@dataclass(frozen=True)
class ChangeRecord:
    """A consumed change record: where it is on its topic, and its value."""
    topic: str
    partition: int
    offset: int
    value: bytes | None


class ChangeEncoder:
    """Change records → records: the envelopes each change maps to, or a dead letter with why it cannot map."""

    def __init__(self, cartridge: Cartridge, sink: KafkaSink | None, sealing: IngressSealing | None = None,
                 max_record_bytes: int = 1_000_000) -> None:
        self.catalog = Catalog(cartridge)
        self.sources: Mapping[str, CompiledSource] = compile_sources(cartridge.spec)[0]
        self.sealing = sealing or IngressSealing(None)
        self.cartridge = cartridge.name
        self.topic = cartridge.topic
        self.dlq = cartridge.dlq_topic
        self.max_record_bytes = sink.max_record_bytes if sink is not None else max_record_bytes

    def encode(self, records: Sequence[ChangeRecord]) -> CdcEncoded:
        out = CdcEncoded()
        for record in records:
            produced = self.one(record)
            if produced is None:
                out.unmapped += 1
                continue
            for r in produced:
                out.add(r, self.topic)
        return out

    def explain(self, value: bytes | str | dict[str, Any] | None) -> tuple[list[dict[str, Any]], str | None]:
        """(the envelopes a change becomes, as the topic gets them but with personal fields in clear; or [] and
        why none): what `keel cdc explain` prints. The reason of a change that cannot map starts with
        `cannot map:` (the relay would dead-letter it)."""
        try:
            change = decode_change(value)
        except Undecodable as e:
            return [], f"cannot map: not a Debezium change event: {e.reason}"
        if isinstance(change, Skipped):
            return [], f"maps to nothing: {change.reason}"
        source = source_for_table(self.sources, change.table)
        if source is None:
            tables = ", ".join(sorted(s.spec.table for s in self.sources.values())) or "none"
            return [], f"maps to nothing: the cartridge maps no table {change.table} (it maps {tables})"
        try:
            mapped = map_change(source, change)
        except Unmappable as e:
            return [], f"cannot map: sources.{source.name}: {e.reason}" + (f": {e.detail}" if e.detail else "")
        if not mapped.envelopes:
            return [], f"maps to nothing: sources.{source.name}: {mapped.reason}"
        out = []
        for envelope in mapped.envelopes:
            envelope = {**envelope, "recorded_at": format_time(change.committed_at)}
            try:
                event = self.catalog.parse(envelope, default_recorded_at=change.committed_at)
            except EnvelopeRejected as e:
                return [], f"cannot map: sources.{source.name}: the envelope is refused: {e.reason}"
            out.append(json.loads(canonical_bytes(event)))
        return out, None

    def one(self, record: ChangeRecord) -> list[OutRecord] | None:
        """The records of one change; None when it maps to nothing. KeyStoreUnavailable stops the step."""
        try:
            change = decode_change(record.value)
        except Undecodable as e:
            return [self._dead(record, f"not a Debezium change event: {e.reason}", None, None)]
        if isinstance(change, Skipped):
            return None
        source = source_for_table(self.sources, change.table)
        if source is None:
            return None
        try:
            mapped = map_change(source, change)
        except Unmappable as e:
            return [self._dead(record, f"sources.{source.name}: {e.reason}", None, None)]
        if not mapped.envelopes:
            return None
        out = []
        for envelope in mapped.envelopes:
            envelope["recorded_at"] = format_time(change.committed_at)
            try:
                text = msgspec.json.encode(envelope)        # parsed as text: the catalog's typed fast path
                event = self.catalog.parse(self.sealing.opened(text), default_recorded_at=change.committed_at)
            except EnvelopeRejected as e:
                return [self._dead(record, f"sources.{source.name}: the envelope is refused: {e.reason}",
                                   envelope.get("id"), envelope.get("tenant"))]
            value = self.sealing.value(event)
            produced = event_record(self.topic, event, value)
            if produced.size() > self.max_record_bytes:
                return [self._dead(record, f"envelope of {produced.size()} bytes exceeds the Kafka record limit",
                                   event.id, event.tenant)]
            out.append(produced)
        return out

    def _dead(self, record: ChangeRecord, reason: str, event_id: str | None, tenant: str | None) -> OutRecord:
        """A dead letter: the reason and the change's position; the change itself stays on its topic (it holds
        the row's values in clear, which a dead-letter topic never keeps). The reason is redacted: a catalog's
        or CEL's words may quote a value (`got 'x'`); `keel cdc explain` of the change shows them whole."""
        reason = redacted(reason)
        where = {"": "cdc", "topic": record.topic, "partition": str(record.partition), "offset": str(record.offset),
                 **{k if k != "txId" else "tx_id": v for k, v in position_of(record.value).items()}}
        key_tenant = tenant if isinstance(tenant, str) and TENANT.match(tenant) else None
        return dead_letter(self.dlq, self.cartridge, b"", reason, event_id=event_id, tenant=key_tenant,
                           source=where)


_QUOTED = re.compile(r"'(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\"")
_GOT = re.compile(r"\bgot [^;,)]*")


def redacted(reason: str) -> str:
    """A reason without the values it may quote (a column may hold personal data; reasons go to headers and logs)."""
    return _GOT.sub("got a value of another type", _QUOTED.sub("'…'", reason))


@dataclass
class CdcStats:
    changes: int = 0
    relayed: int = 0
    dead_lettered: int = 0
    unmapped: int = 0
    steps: int = 0
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return (f"{self.changes} change(s): relayed {self.relayed} event(s), {self.dead_lettered} dead letter(s), "
                f"{self.unmapped} mapped to nothing in {elapsed:.1f}s ({self.changes / elapsed:,.0f} changes/s)")


class ChangeSource:
    """The change topics, read by a consumer group with offsets committed by hand after Kafka acknowledged the
    envelopes made of them."""

    def __init__(self, bootstrap: str, topics: Sequence[str], group: str) -> None:
        self.bootstrap = bootstrap
        self.topics = list(topics)
        self.group = group
        self._consumer: AIOKafkaConsumer | None = None

    async def start(self) -> None:
        pattern = "^(" + "|".join(re.escape(t) for t in self.topics) + ")$"
        consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap_list(self.bootstrap), group_id=self.group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    metadata_max_age_ms=2000, client_id="keel-cdc")
        consumer.subscribe(pattern=pattern)        # a change topic appears when Debezium first writes to it
        async with kafka_guard("connect the change consumer", self.bootstrap):
            await consumer.start()
        self._consumer = consumer

    async def stop(self) -> None:
        consumer, self._consumer = self._consumer, None
        if consumer is not None:
            async with kafka_guard("close the change consumer", self.bootstrap):
                await consumer.stop()

    async def read(self, batch: int, wait_ms: int) -> list[ChangeRecord]:
        assert self._consumer is not None
        async with kafka_guard("read the change topics", self.bootstrap):
            got = await self._consumer.getmany(timeout_ms=wait_ms, max_records=batch)
        out = []
        for tp, records in sorted(got.items(), key=lambda kv: (kv[0].topic, kv[0].partition)):
            out += [ChangeRecord(tp.topic, tp.partition, r.offset, r.value) for r in records]
        return out

    async def commit(self, records: Sequence[ChangeRecord]) -> bool:
        """Commit the offsets after `records`; False when a rebalance took the partitions (they are re-read by
        their new owner: the same envelopes again)."""
        assert self._consumer is not None
        offsets: dict[TopicPartition, int] = {}
        for r in records:
            tp = TopicPartition(r.topic, r.partition)
            offsets[tp] = max(offsets.get(tp, 0), r.offset + 1)
        if not offsets:
            return True
        try:
            async with kafka_guard("commit the change offsets", self.bootstrap):
                await self._consumer.commit(offsets)
        except KafkaUnavailable as e:
            if isinstance(e.__cause__, CommitFailedError):
                return False
            raise
        return True

    def assigned(self) -> bool:
        return bool(self._consumer is not None and self._consumer.assignment())

    async def caught_up(self) -> bool:
        """Whether every assigned partition's position reached its end (`--once`)."""
        assert self._consumer is not None
        assigned = self._consumer.assignment()
        if not assigned:
            return False
        async with kafka_guard("read the change topics' ends", self.bootstrap):
            ends = await self._consumer.end_offsets(list(assigned))
            for tp in assigned:
                if await self._consumer.position(tp) < ends[tp]:
                    return False
        return True


async def relay_changes(cartridge: Cartridge, source: ChangeSource, sink: KafkaSink, options: CdcOptions, log: Log,
                        stop: asyncio.Event, *, topics: TopicSpec | None = None, probes: Probes | None = None,
                        sealing: IngressSealing | None = None, stats: CdcStats | None = None,
                        backoff_s: tuple[float, float] = (0.5, 30.0)) -> CdcStats:
    """Relay until `stop` (or, with `once`, until the change topics are read to their end); on a lost Kafka, log,
    wait and start again from the committed offsets (with `once`, fail instead)."""
    probes = probes or Probes()
    metrics = CdcMetrics(probes, cartridge.name)
    probes.watch("kafka")
    keys = sealing is not None and sealing.privacy is not None
    if keys:
        probes.watch("keys")
    stats = stats if stats is not None else CdcStats()
    delay = backoff_s[0]
    encoder = ChangeEncoder(cartridge, sink, sealing)
    log(f"relaying {', '.join(source.topics)} -> {cartridge.topic} as group {options.group!r}")
    while not stop.is_set():
        probes.health.beat(BEAT)
        try:
            await sink.start()
            await sink.ensure_topics([cartridge.topic, cartridge.dlq_topic], topics or TopicSpec())
            await source.start()
            probes.reachable("kafka")
            if keys:
                probes.reachable("keys")
            delay = backoff_s[0]
            await _loop(encoder, source, sink, options, log, stop, probes.health, metrics, stats)
            break
        except (KafkaUnavailable, StoreUnavailable) as e:
            system = "kafka" if isinstance(e, KafkaUnavailable) else "keys"
            probes.unreachable(system, e)
            metrics.errors.labels(cartridge.name, system).inc()
            if options.once:
                raise
            log(f"{e}; retrying in {delay:.1f}s from the committed offsets")
            try:
                await asyncio.wait_for(stop.wait(), delay)
            except TimeoutError:
                pass
            delay = min(delay * 2, backoff_s[1])
        finally:
            for close in (source.stop, sink.stop):
                try:
                    await close()
                except (KafkaUnavailable, KafkaError) as e:
                    log(f"closing: {e}")
    probes.health.retire(BEAT)
    log(f"stopped: {stats.line()}")
    return stats


async def _loop(encoder: ChangeEncoder, source: ChangeSource, sink: KafkaSink, options: CdcOptions, log: Log,
                stop: asyncio.Event, health: Health, metrics: CdcMetrics, stats: CdcStats) -> None:
    last = started = time.monotonic()
    while not stop.is_set():
        health.beat(BEAT)
        records = await source.read(options.batch, options.poll_ms)
        if records:
            encoded = encoder.encode(records)
            await sink.send_all(encoded.records)
            if not await source.commit(records):
                log("a rebalance moved partitions before the step's offsets were committed; their new owner "
                    "reads them again (the same envelopes)")
            stats.changes += len(records)
            stats.relayed += encoded.relayed
            stats.dead_lettered += encoded.dead
            stats.unmapped += encoded.unmapped
            stats.steps += 1
            metrics.count(len(records), encoded)
        if time.monotonic() - last >= options.progress_s:
            log(f"so far: {stats.line()}")
            last = time.monotonic()
        if options.once and not records:
            if await source.caught_up():
                break
            if not source.assigned() and time.monotonic() - started >= ONCE_WAIT_S:
                log(f"no change topic of {', '.join(source.topics)} exists after {ONCE_WAIT_S:.0f}s; nothing "
                    "to relay yet (Debezium creates a table's topic at its first change)")
                break


class CdcMetrics:
    """The relay's series: changes read, envelopes relayed, dead letters, changes mapped to nothing, outages."""

    def __init__(self, probes: Probes, cartridge: str) -> None:
        from prometheus_client import Counter
        registry = probes.registry
        self.changes = Counter("keel_cdc_changes", "Change records read from the change topics.", ["cartridge"],
                               registry=registry).labels(cartridge)
        self.relayed = Counter("keel_cdc_events_relayed", "Envelopes produced to the events topic.",
                               ["cartridge"], registry=registry).labels(cartridge)
        self.dead = Counter("keel_cdc_dead_lettered", "Changes that could not map, sent to the dead-letter topic.",
                            ["cartridge"], registry=registry).labels(cartridge)
        self.unmapped = Counter("keel_cdc_unmapped", "Changes that map to nothing (no entry, no condition, a "
                                "tombstone).", ["cartridge"], registry=registry).labels(cartridge)
        self.errors = Counter("keel_cdc_errors", "Outages of Kafka or the key store (the relay retries).",
                              ["cartridge", "system"], registry=registry)

    def count(self, changes: int, encoded: CdcEncoded) -> None:
        self.changes.inc(changes)
        self.relayed.inc(encoded.relayed)
        self.dead.inc(encoded.dead)
        self.unmapped.inc(encoded.unmapped)
