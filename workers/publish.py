"""`keel publish`: check each line of an events file with the cartridge's catalog and send every valid
envelope to the cartridge's topic, keyed by tenant, acks=all, in file order (streamed: any file size).

Each envelope is sent in its canonical form, exactly as file mode reads it (`Event.to_envelope()`:
recorded_at filled, source defaulted), so a file and its topic build identical graphs. Bad lines are
reported with their line numbers and not sent.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from keel.cartridge import Cartridge
from keel.embedded import Rejected
from keel.envelope import Catalog, in_a_file
from keel.errors import EnvelopeRejected
from keel.kafka import TopicSpec, ensure_topics, kafka_guard, new_producer
from keel.privacy import Privacy
from keel.times import now_micros
from keel.wire import canonical_bytes, events_topic, record_key

Progress = Callable[[int, int], None]
_WINDOW = 20_000            # records in flight before waiting for acknowledgements


@dataclass
class Prepared:
    """An events file checked and encoded: (key, value) per valid line in file order (`records` stays empty
    while `checked_records` streams them), the rejected lines and the tenants seen."""
    records: list[tuple[bytes, bytes]] = field(default_factory=list)
    rejected: list[Rejected] = field(default_factory=list)
    tenants: set[str] = field(default_factory=set)


def checked_records(cartridge: Cartridge, path: str | Path, into: Prepared,
                    on_reject: Callable[[Rejected], None] | None = None, *,
                    recorded_now: bool = False, privacy: Privacy | None = None) -> Iterator[tuple[bytes, bytes]]:
    """Stream the valid lines of a file as (tenant, canonical envelope); rejects and tenants go to `into`.
    An envelope without recorded_at gets occurred_at (file mode's rule), or with `recorded_now` the time
    the publishing started (re-sent or late data: the graph learns it now, never backdated). With `privacy`,
    each line is checked in clear (a sealed line is revealed first) and its personal fields are sealed with
    the key store before it is sent: the topic never holds them in clear (docs/privacy.md)."""
    catalog = Catalog(cartridge)
    now = now_micros() if recorded_now else None
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                if privacy is not None:
                    raw = privacy.reveal_line(raw, clear_ok=True)   # sealed below, before it is sent
                event = catalog.parse(raw, default_recorded_at=now)
                if privacy is not None:
                    sealed = privacy.seal(event.to_envelope())
                    into.tenants.add(event.tenant)
                    yield record_key(event.tenant), json.dumps(sealed, ensure_ascii=False,
                                                               separators=(",", ":")).encode()
                    continue
            except EnvelopeRejected as e:
                rejected = Rejected(number, e.event_id, in_a_file(e.reason))
                into.rejected.append(rejected)
                if on_reject is not None:
                    on_reject(rejected)
                continue
            into.tenants.add(event.tenant)
            yield record_key(event.tenant), canonical_bytes(event)


def prepare(cartridge: Cartridge, path: str | Path, on_reject: Callable[[Rejected], None] | None = None) -> Prepared:
    """Check every line with the catalog, keeping the valid ones in memory (tests, benchmarks)."""
    out = Prepared()
    out.records = list(checked_records(cartridge, path, out, on_reject))
    return out


def count_lines(path: str | Path) -> int:
    """Non-blank lines of a file (the total a progress display shows)."""
    with open(path, "rb") as f:
        return sum(1 for line in f if line.strip())


@dataclass
class PublishReport:
    topic: str
    partitions: int
    sent: int
    rejected: int
    tenants: int
    seconds: float

    def summary(self) -> str:
        rate = f", {self.sent / self.seconds:,.0f}/s" if self.seconds > 0 and self.sent else ""
        bad = f"; {self.rejected} line(s) rejected and not sent" if self.rejected else ""
        return (f"published {self.sent} event(s) of {self.tenants} tenant(s) to {self.topic} "
                f"({self.partitions} partitions) in {self.seconds:.1f}s{rate}{bad}")


async def send_records(bootstrap: str, topic: str, records: Iterable[tuple[bytes, bytes]],
                       progress: Progress | None = None, total: int = 0) -> int:
    """Produce (key, value) records in order and return once Kafka acknowledged all of them."""
    producer = new_producer(bootstrap)
    async with kafka_guard(f"produce to {topic}", bootstrap):
        await producer.start()
        try:
            pending: list[asyncio.Future] = []
            done = 0
            for key, value in records:
                pending.append(await producer.send(topic, value=value, key=key))
                if len(pending) >= _WINDOW:
                    await asyncio.gather(*pending)
                    done += len(pending)
                    pending.clear()
                    if progress is not None:
                        progress(done, total)
            await asyncio.gather(*pending)
            done += len(pending)
            if progress is not None:
                progress(done, total)
        finally:
            await producer.stop()
    return done


async def publish_prepared(cartridge: Cartridge, prepared: Prepared, bootstrap: str, topics: TopicSpec,
                           progress: Progress | None = None) -> PublishReport:
    """Send records already checked (`prepare`)."""
    return await _publish(cartridge, prepared, prepared.records, bootstrap, topics, progress, len(prepared.records))


async def _publish(cartridge: Cartridge, into: Prepared, records: Iterable[tuple[bytes, bytes]], bootstrap: str,
                   topics: TopicSpec, progress: Progress | None, total: int) -> PublishReport:
    topic = events_topic(cartridge.name)
    started = time.monotonic()
    counts = await ensure_topics(bootstrap, [topic], topics)
    sent = await send_records(bootstrap, topic, records, progress, total)
    return PublishReport(topic, counts[topic], sent, len(into.rejected), len(into.tenants),
                         time.monotonic() - started)


def publish_file(cartridge: Cartridge, path: str | Path, bootstrap: str, *, topics: TopicSpec | None = None,
                 on_reject: Callable[[Rejected], None] | None = None,
                 progress: Progress | None = None, recorded_now: bool = False,
                 privacy: Privacy | None = None) -> PublishReport:
    """Check and send a whole events file, streaming it; returns once every record is acknowledged. `privacy`:
    seal the cartridge's personal fields with its key store first."""
    into = Prepared()
    total = count_lines(path) if progress is not None else 0
    records = checked_records(cartridge, path, into, on_reject, recorded_now=recorded_now, privacy=privacy)
    return asyncio.run(_publish(cartridge, into, records, bootstrap, topics or TopicSpec(), progress, total))
