"""How a record of an events topic is judged, once for the worker (workers/applier.py) and the replay
(workers/replay_build.py), so that a replay rebuilds exactly what live ingestion built.

A record is refused (with a reason) when its value is missing or not a valid envelope, when its key is not
the envelope's tenant (Keel's topics are keyed by tenant), when a note is refused or a handler fails. An
event id seen before is a duplicate. A record of a newer version of its event type than the cartridge knows
is held: neither applied nor refused, its partition stops there until a cartridge that knows the version
runs (keel/upcast.py; the applier plans nothing after it, the worker pauses the partition at it).
Otherwise the event's writes, as the Projector produced them on the recording mirror, are returned with the
tenant they belong to (the global tenant for global notes).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from keel.envelope import TENANT, Event
from keel.errors import (
    EnvelopeRejected,
    HandlerFailed,
    KeelError,
    PersonalDataInClear,
    StoreUnavailable,
    UsageError,
    VersionUnknown,
)
from keel.projector import Projector
from keel.store.base import Write

from .mirror import RecordingStore
from .records import Record

Reveal = Callable[[bytes], bytes]
PrefetchKeys = Callable[[list[bytes | None]], None]   # keel.privacy.Privacy.prefetch: a batch's keys in one request
Outcome = Literal["skipped", "refused", "duplicate", "applied", "held"]
EMPTY_RECORD = "empty record: the value must be an event envelope"


@dataclass
class Verdict:
    """What became of one record: skipped (the durable store holds it), refused (why), a duplicate event
    id, applied (with its writes), or held (a version newer than the cartridge knows: `version` says which)."""
    outcome: Outcome
    tenant: str | None = None
    event: Event | None = None
    reason: str | None = None
    event_id: str | None = None
    writes: list[tuple[str, list[Write], str | None]] = field(default_factory=list)   # (tenant, writes, id)
    version: VersionUnknown | None = None
    kept: bytes | None = None       # refused: what the dead letter keeps instead of the record's value (masked)


def judge(projector: Projector, recorder: RecordingStore, record: Record,
          already_applied: Callable[[str], bool] | None = None, reveal: Reveal | None = None) -> Verdict:
    """Judge and (unless refused or a duplicate) apply one record on the recording mirror.

    `already_applied(tenant)` lets the worker skip a record the durable store already holds (by offset); it
    is asked as soon as the record's tenant is known (before a refusal is reported, too). `reveal`
    (keel.privacy.Privacy.reveal_line) decrypts the record's personal fields first, or masks them when their
    key was erased; a field that does not verify, or a key the store never held, refuses the record, and so do
    personal fields in clear (unless the cartridge accepts them): then `kept` is the value with them masked."""
    try:
        if record.value is None:
            raise EnvelopeRejected(EMPTY_RECORD)
        value = record.value
        if reveal is not None:
            try:
                value = reveal(value)
            except UsageError as e:         # a key id the store never held (another key store?)
                raise EnvelopeRejected(str(e)) from None
        event = projector.parse(value, default_recorded_at=record.timestamp_micros)
    except VersionUnknown as e:
        tenant = e.tenant if e.tenant and TENANT.match(e.tenant) else None
        if tenant is not None and already_applied is not None and already_applied(tenant):
            return Verdict("skipped", tenant)       # applied by a worker that knew the version (then rolled back)
        return Verdict("held", tenant, reason=e.reason, event_id=e.event_id, version=e)
    except EnvelopeRejected as e:
        tenant = e.tenant if e.tenant and TENANT.match(e.tenant) else None
        if tenant is not None and already_applied is not None and already_applied(tenant):
            return Verdict("skipped", tenant)
        kept = e.masked if isinstance(e, PersonalDataInClear) else None     # personal values never kept in clear
        return Verdict("refused", tenant, reason=e.reason, event_id=e.event_id, kept=kept)
    tenant = event.tenant
    if already_applied is not None and already_applied(tenant):
        return Verdict("skipped", tenant, event)
    if record.key != tenant.encode():
        shown = None if record.key is None else record.key.decode("utf-8", "replace")
        return Verdict("refused", tenant, event, f"record key {shown!r} is not the envelope's tenant {tenant!r} "
                                                 f"(Keel's topics are keyed by tenant)", event.id)
    recorder.take()                 # nothing recorded before this event belongs to it
    recorder.recording = True
    try:
        outcome = projector.apply(event, record.origin)
    except StoreUnavailable:
        raise
    except EnvelopeRejected as e:
        return Verdict("refused", tenant, event, e.reason, event.id)
    except HandlerFailed as e:
        return Verdict("refused", tenant, event, str(e), event.id)
    except KeelError as e:
        return Verdict("refused", tenant, event, f"{type(e).__name__}: {e}", event.id)
    finally:
        recorder.recording = False
        applied = recorder.take()
    if outcome == "duplicate":
        return Verdict("duplicate", tenant, event, event_id=event.id)
    return Verdict("applied", tenant, event, event_id=event.id, writes=applied)
