"""The projection side of a replay: records of a partition → the cartridge's handlers on an in-memory mirror of
each tenant being rebuilt → each event's writes, collected for the shadow generation.

Records are judged by the worker's own function (workers/judge.py): parsed with the cartridge's
catalog, recorded_at defaulting to the record timestamp; an invalid envelope, an envelope whose tenant is not
the record key, a refused note or a handler failure is skipped and counted (live ingestion already sent it to
the dead-letter topic); an event id seen before is a duplicate. A record of a version newer than the cartridge
knows ends the replay (UsageError): skipping it would rebuild the tenant without it.
Global notes are not written again (they live outside the tenant and were applied live); the tenant's own mark
of the note event is.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from keel.cartridge import Cartridge
from keel.errors import UsageError
from keel.projector import Projector
from keel.store.base import GLOBAL_TENANT, EventWrites

from .judge import PrefetchKeys, Reveal, judge
from .mirror import RecordingStore
from .records import Record


@dataclass
class TenantProgress:
    """What a replay did for one tenant."""
    applied: int = 0
    skipped: int = 0          # rejected envelopes and handler failures (already dead-lettered live)
    duplicates: int = 0
    global_notes: int = 0     # note events whose fact lives in the global graph (not rewritten)
    pending: list[EventWrites] = field(default_factory=list)      # writes not committed to the shadow yet


class PartitionBuild:
    """Rebuilds the tenants of one partition in memory; `accepts(tenant)` says which keys to rebuild."""

    def __init__(self, cartridge: Cartridge, accepts: Callable[[str], bool], *,
                 allow_global_notes: bool = False, reveal: Reveal | None = None,
                 prefetch_keys: PrefetchKeys | None = None) -> None:
        self.accepts = accepts
        self.reveal = reveal
        self.prefetch_keys = prefetch_keys      # the key store asked once per fetched batch (Privacy.prefetch)
        self.mirror = RecordingStore()
        self.projector = Projector(cartridge, self.mirror, allow_global_notes=allow_global_notes)
        self.tenants: dict[str, TenantProgress] = {}
        self.done: dict[str, TenantProgress] = {}        # switched: their records are ignored from now on
        self.pending = 0          # events not committed yet, all tenants

    def feed(self, records: Iterable[Record]) -> None:
        """Apply the records whose key is a tenant being rebuilt, in order."""
        records = list(records)
        if self.prefetch_keys is not None:
            self.prefetch_keys([r.value for r in records])
        for record in records:
            key = record.key
            if key is None:
                continue
            tenant = key.decode("utf-8", "replace")
            progress = self.tenants.get(tenant)
            if progress is None:
                if tenant in self.done or not self.accepts(tenant):
                    continue
                progress = self.tenants[tenant] = TenantProgress()
            self._apply(tenant, progress, record)

    def _apply(self, tenant: str, progress: TenantProgress, record: Record) -> None:
        verdict = judge(self.projector, self.mirror, record, reveal=self.reveal)
        if verdict.outcome == "held":
            raise UsageError(f"tenant {tenant!r}, {record.origin}: {verdict.reason}; replay with that cartridge (no "
                             f"tenant of partition {record.partition} was switched)")
        if verdict.outcome == "refused":
            progress.skipped += 1
            return
        if verdict.outcome == "duplicate":
            progress.duplicates += 1
            return
        progress.applied += 1
        for where, writes, event_id in verdict.writes:
            if where == GLOBAL_TENANT:
                progress.global_notes += 1
            else:
                progress.pending.append((writes, event_id or verdict.event_id))
                self.pending += 1

    def take(self) -> dict[str, list[EventWrites]]:
        """Every tenant's events not committed yet (every tenant appears, to carry the scanned offset)."""
        out = {}
        for tenant, progress in self.tenants.items():
            out[tenant], progress.pending = progress.pending, []
        self.pending = 0
        return out

    def add_tenant(self, tenant: str) -> None:
        """Rebuild this tenant even if none of its records has been seen yet."""
        self.tenants.setdefault(tenant, TenantProgress())

    def finish(self, tenant: str) -> None:
        """The tenant was switched: ignore its further records and free its mirror."""
        progress = self.tenants.pop(tenant, None)
        if progress is not None:
            self.pending -= len(progress.pending)
            self.done[tenant] = progress
        self.mirror.drop(tenant)
