"""`keel dlq list|show|redrive`: look at a cartridge's dead letters and send the fixable ones again.

Redrive re-sends a letter's envelope to the events topic with `recorded_at` set to the time of the redrive
(the graph learns it now: knowledge is never backdated), checked with the cartridge's catalog first (a
letter still rejected is reported and left open), keyed by tenant, with the header `keel.redrive.of` =
`<dlq topic>:<partition>:<offset>`. Then a marker is appended to the dead-letter topic (see
keel/deadletters.py), which closes the letter: `keel status` counts open letters. A crash between the two
sends at worst the event twice: the worker applies an event id once.
"""
from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from keel.cartridge import Cartridge
from keel.deadletters import DeadLetters, Letter, read_dead_letters
from keel.envelope import Catalog
from keel.errors import EnvelopeRejected, UsageError
from keel.kafka import kafka_guard, new_producer
from keel.times import format_time, now_micros, parse_time
from keel.wire import (
    EVENT_ID,
    REDRIVE_OF,
    REDRIVEN,
    REDRIVEN_AT,
    canonical_bytes,
    dlq_topic,
    events_topic,
    record_key,
)


@dataclass(frozen=True)
class Filter:
    """Which letters a command works on; every given condition must hold."""
    tenant: str | None = None
    reason: str | None = None          # substring, case-insensitive
    since: int | None = None           # micros, the letter's time in the topic
    until: int | None = None
    refs: frozenset[str] = frozenset()   # "<partition>:<offset>"
    include_redriven: bool = False

    @classmethod
    def of(cls, tenant: str | None, reason: str | None, since: str | None, until: str | None,
           refs: Iterable[str] = (), include_redriven: bool = False) -> Filter:
        for ref in refs:
            p, _, o = ref.partition(":")
            if not (p.isdigit() and o.isdigit()):
                raise UsageError(f"dead letter {ref!r}: expected <partition>:<offset> as `keel dlq list` shows")
        return cls(tenant, reason, None if since is None else parse_time(since),
                   None if until is None else parse_time(until), frozenset(refs), include_redriven)

    def select(self, dead: DeadLetters) -> list[Letter]:
        out = []
        for x in dead.letters:
            at = x.timestamp_ms * 1000
            if (self.tenant is not None and x.tenant != self.tenant) \
                    or (self.reason is not None and self.reason.lower() not in x.reason.lower()) \
                    or (self.since is not None and at < self.since) or (self.until is not None and at > self.until) \
                    or (self.refs and x.ref not in self.refs) \
                    or (not self.include_redriven and x.ref in dead.redriven):
                continue
            out.append(x)
        return out


def load(cartridge: Cartridge, bootstrap: str) -> DeadLetters:
    return asyncio.run(read_dead_letters(bootstrap, dlq_topic(cartridge.name)))


def letter_doc(x: Letter, dead: DeadLetters, *, value: bool = False) -> dict[str, Any]:
    doc: dict[str, Any] = {"ref": x.ref, "at": format_time(x.timestamp_ms * 1000), "tenant": x.tenant or None,
                           "writer": x.writer, "event_id": x.headers.get(EVENT_ID), "reason": x.reason,
                           "redriven_at": None if x.ref not in dead.redriven
                           else format_time(dead.redriven[x.ref] * 1000)}
    if value:
        doc["headers"] = x.headers
        doc["key"] = None if x.key is None else x.key.decode("utf-8", "replace")
        doc["value"] = None if x.value is None else x.value.decode("utf-8", "replace")
    return doc


def render_list(letters: list[Letter], dead: DeadLetters) -> str:
    if not letters:
        return "no dead letters match"
    lines = []
    for x in letters:
        d = letter_doc(x, dead)
        done = f"  [redriven {d['redriven_at']}]" if d["redriven_at"] else ""
        reason = d["reason"] if len(d["reason"]) <= 100 else d["reason"][:99] + "…"
        lines.append(f"{d['ref']:>10}  {d['at']}  {d['tenant'] or '-'}  {d['writer']}  {d['event_id'] or '-'}  "
                     f"{reason}{done}")
    lines.append(f"{len(letters)} dead letter(s)")
    return "\n".join(lines)


@dataclass
class RedriveReport:
    sent: list[str] = field(default_factory=list)                    # refs
    refused: list[tuple[str, str]] = field(default_factory=list)     # (ref, why)
    recorded_at: str = ""

    def summary(self) -> str:
        lines = [f"redriven {len(self.sent)} dead letter(s) with recorded_at {self.recorded_at}"]
        lines += [f"  not redriven {ref}: {why}" for ref, why in self.refused]
        return "\n".join(lines)


def plan_redrive(cartridge: Cartridge, letters: list[Letter], recorded_at: int
                 ) -> tuple[list[tuple[Letter, bytes, bytes]], list[tuple[str, str]]]:
    """(letter, key, canonical envelope stamped `recorded_at`) for each letter the catalog now accepts."""
    catalog = Catalog(cartridge)
    stamp = format_time(recorded_at)
    ok, refused = [], []
    for x in letters:
        try:
            env = json.loads(x.value or b"")
        except ValueError:
            refused.append((x.ref, ("its value is not a JSON envelope: fix it by hand and `keel publish "
                                   "--recorded-at now` the fixed line")))
            continue
        if not isinstance(env, dict):
            refused.append((x.ref, "its value is not a JSON object"))
            continue
        env["recorded_at"] = stamp
        try:
            event = catalog.parse(json.dumps(env).encode())
        except EnvelopeRejected as e:
            refused.append((x.ref, f"still rejected: {e.reason}"))
            continue
        ok.append((x, record_key(event.tenant), canonical_bytes(event)))
    return ok, refused


def redrive(cartridge: Cartridge, bootstrap: str, flt: Filter, *, dry_run: bool = False) -> RedriveReport:
    dead = load(cartridge, bootstrap)
    now = now_micros()
    ok, refused = plan_redrive(cartridge, flt.select(dead), now)
    report = RedriveReport([x.ref for x, _, _ in ok], refused, format_time(now) or "")
    if ok and not dry_run:
        asyncio.run(_send(cartridge, bootstrap, ok, report.recorded_at))
    return report


def close(cartridge: Cartridge, bootstrap: str, flt: Filter) -> list[str]:
    """Close the selected open letters without sending anything (dealt with by hand, e.g. a fixed envelope
    sent with `keel publish --recorded-at now`); returns their refs."""
    letters = flt.select(load(cartridge, bootstrap))
    stamp = format_time(now_micros()) or ""
    if letters:
        asyncio.run(_send(cartridge, bootstrap, [(x, None, None) for x in letters], stamp))
    return [x.ref for x in letters]


async def _send(cartridge: Cartridge, bootstrap: str, ok: list[tuple[Letter, bytes | None, bytes | None]],
                stamp: str) -> None:
    """The events (acknowledged; none when closing), then the markers closing their letters."""
    topic, dlq = events_topic(cartridge.name), dlq_topic(cartridge.name)
    producer = new_producer(bootstrap)
    async with kafka_guard(f"redrive to {topic}", bootstrap):
        await producer.start()
        try:
            sent = [await producer.send(topic, key=key, value=value,
                                        headers=[(REDRIVE_OF, f"{dlq}:{x.ref}".encode())])
                    for x, key, value in ok if value is not None]
            await asyncio.gather(*sent)
            marks = [await producer.send(dlq, key=f"redriven {x.ref}".encode(), value=None,
                                         headers=[(REDRIVEN, x.ref.encode()), (REDRIVEN_AT, stamp.encode())])
                     for x, _, _ in ok]
            await asyncio.gather(*marks)
        finally:
            await producer.stop()
