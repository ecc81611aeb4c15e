"""`keel erase … --redis URL --kafka BOOTSTRAP` (docs/privacy.md): erase a data subject on the Kafka -> workers ->
Redis path. The subject's keys are deleted from the key store, the PII-free `keel.erased` receipt is produced to
the cartridge's topic, then the tenant is rebuilt from the log (`keel replay --tenant T`, called as a function),
so that the live graph holds no version of the subject's personal values: the rebuild reads the sealed fields
with the keys deleted, i.e. as the mask.

Idempotent: a second call deletes nothing, produces the receipt only when the graph does not hold it yet (its id
is fixed by the erasure), and rebuilds the tenant again (cheap, and completes a call interrupted before its
rebuild)."""
from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.errors import UsageError
from keel.kafka import TopicSpec, ensure_topics
from keel.keystore_pg import privacy_of
from keel.privacy_commands import check_erase_arguments, receipt, receipt_id
from keel.wire import events_topic, record_key

from .publish import send_records
from .replay import ReplayOptions, ReplayReport, replay
from .replay_progress import Progress


@dataclass
class EraseReport:
    tenant: str
    subject: str
    deleted: int                # keys deleted by this call
    keys: int                   # keys the erasure deleted (this call or an earlier one)
    at: str                     # when the keys were deleted
    receipt: str                # the receipt's event id
    produced: bool              # the receipt was produced by this call
    rebuild: ReplayReport

    def summary(self) -> str:
        what = "erased" if self.deleted else f"already erased at {self.at}"
        keys = f"{self.keys} key" if self.keys == 1 else f"{self.keys} keys"
        sent = "produced to the topic" if self.produced else "already in the graph"
        return (f"{self.subject} of tenant {self.tenant}: {what} ({keys} deleted); receipt {self.receipt} {sent}; "
                f"tenant {self.tenant} rebuilt from the log")


def erase_in_stream(cartridge: Cartridge, settings: Settings, tenant: str, subject: str,
                    reason: str | None = None, *, progress: Progress | None = None) -> EraseReport | None:
    """Erase `subject` of `tenant`; None when the key store never held a key of it (nothing done)."""
    check_erase_arguments(tenant, subject, reason)
    if not settings.redis_url:
        raise UsageError("Redis/Kafka mode rebuilds the tenant in Redis: pass --redis URL")
    privacy = privacy_of(cartridge, settings)
    if privacy is None:
        raise UsageError(f"cartridge {cartridge.name!r} declares no personal fields (`personal:` in cartridge.yaml): "
                         f"there is nothing to erase")
    keys = privacy.keys
    assert keys is not None
    deleted = keys.erase(tenant, subject, reason=reason)
    done = keys.erasure(tenant, subject)
    if done is None:
        return None
    rid = receipt_id(tenant, subject, done)
    store = open_redis_store(cartridge, settings)
    try:
        present = store.has_event(tenant, rid)
    finally:
        store.close()
    if not present:
        value = json.dumps(receipt(tenant, subject, done, reason), ensure_ascii=False, separators=(",", ":"))
        asyncio.run(_produce(settings.kafka_bootstrap, events_topic(cartridge.name),
                             [(record_key(tenant), value.encode())]))
    rebuilt = replay(cartridge, settings, tenants=[tenant], options=ReplayOptions(), progress=progress)
    return EraseReport(tenant, subject, deleted, int(done["keys"]), str(done["at"]), rid, not present, rebuilt)


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    await ensure_topics(bootstrap, [topic], TopicSpec())
    await send_records(bootstrap, topic, records)
