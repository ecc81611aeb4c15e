"""Reading a dead-letter topic (`keel.<cartridge>.dlq`), whoever wrote to it: stream workers (`keel.source.topic`
/`.partition`/`.offset` headers), the outbox relay and the webhook (`keel.source` and their own
`keel.source.*` headers). Used by `keel status` (counts, rate) and `keel dlq` (list, show, redrive).

A dead letter is identified by its place in the dead-letter topic, written `<partition>:<offset>`. The same
source record may be dead-lettered twice (a worker batch redone after a crash): letters with the same
`keel.source*` headers count once. A redrive appends a marker record to the dead-letter topic (key `redriven <partition>:<offset>`,
no value, header `keel.redriven` = the letter's `<partition>:<offset>`, `keel.redriven_at`), so "open" dead letters
(not redriven yet) can be counted from the topic alone, and the count goes down when they are dealt with.
Tools reading the topic should skip records with a `keel.redriven` header.
"""
from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from .kafka import read_to_end, topic_partitions
from .wire import REASON, REDRIVEN, SOURCE, TENANT

HOUR_MS = 3_600_000


@dataclass(frozen=True)
class Letter:
    """One dead letter as read from the topic."""
    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, str]

    @property
    def ref(self) -> str:
        return f"{self.partition}:{self.offset}"

    @property
    def tenant(self) -> str:
        return self.headers.get(TENANT, "")

    @property
    def reason(self) -> str:
        return self.headers.get(REASON, "")

    @property
    def writer(self) -> str:
        """Who dead-lettered it: `worker`, or the ingress path named by `keel.source` (outbox, webhook, …)."""
        return self.headers.get(SOURCE) or ("worker" if f"{SOURCE}.offset" in self.headers else "unknown")

    @property
    def source_key(self) -> tuple[tuple[str, str], ...]:
        """What identifies the source record: its `keel.source*` headers (its own place when it has none)."""
        src = tuple(sorted((k, v) for k, v in self.headers.items() if k == SOURCE or k.startswith(SOURCE + ".")))
        return src or (("dlq", self.ref),)


@dataclass
class DeadLetters:
    """The letters of a dead-letter topic (duplicates of one source record folded) and the redrive markers."""
    letters: list[Letter] = field(default_factory=list)
    redriven: dict[str, int] = field(default_factory=dict)       # letter ref -> when (ms)

    def open(self) -> list[Letter]:
        return [x for x in self.letters if x.ref not in self.redriven]

    def summary(self, now_ms: int | None = None) -> dict[str, Any]:
        """Counts for `keel status`: total, open (not redriven), the last hour, per tenant and per writer."""
        now_ms = int(time.time() * 1000) if now_ms is None else now_ms
        open_ = self.open()
        return {"total": len(self.letters), "open": len(open_), "redriven": len(self.letters) - len(open_),
                "last_hour": sum(1 for x in self.letters if x.timestamp_ms >= now_ms - HOUR_MS),
                "by_tenant": dict(sorted(Counter(x.tenant for x in open_).items())),
                "by_writer": dict(sorted(Counter(x.writer for x in self.letters).items()))}


def text_headers(headers: Iterable[tuple[str, bytes]]) -> dict[str, str]:
    return {k: v.decode("utf-8", "replace") for k, v in headers}


def fold(records: Iterable[Any]) -> DeadLetters:
    """Consumed records of a dead-letter topic → letters (first of each source record) and redrive markers."""
    out = DeadLetters()
    seen: set[tuple[tuple[str, str], ...]] = set()
    for r in records:
        headers = text_headers(r.headers or ())
        if REDRIVEN in headers:
            out.redriven[headers[REDRIVEN]] = r.timestamp
            continue
        letter = Letter(r.partition, r.offset, r.timestamp, r.key, r.value, headers)
        if letter.source_key in seen:
            continue
        seen.add(letter.source_key)
        out.letters.append(letter)
    return out


async def read_dead_letters(bootstrap: str, topic: str) -> DeadLetters:
    """Every record of the topic up to its current end (no consumer group, nothing committed)."""
    tps = await topic_partitions(bootstrap, topic)
    records = [r async for r in read_to_end(bootstrap, tps, "keel-dlq")]
    records.sort(key=lambda r: (r.timestamp, r.partition, r.offset))
    return fold(records)
