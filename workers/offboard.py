"""`keel offboard <cartridge> --redis URL --kafka BOOTSTRAP --tenant T` (docs/privacy.md): tenant T leaves.

In order, each step idempotent, so a second call (or a call after an interrupted one) completes the first:

1. every key of T is deleted from the key store (a cartridge with `personal:`), which records the offboarding
   and refuses to create a key for T again;
2. T is recorded in the namespace's offboarded set (workers/offboarded.py): from their next batch on, workers
   refuse T's records to the dead-letter topic, and `keel replay` skips T;
3. the PII-free `keel.offboarded` receipt is produced to the cartridge's topic (once: the set says whether it
   was), so the log itself says T left (a replay that meets it refuses T too);
4. the command waits (up to `settle_s`) until the workers' group has committed past the receipt, so that no
   batch planned before step 2 still writes T's keys;
5. every Redis key of T, in every generation, is dropped (its generations, its generation counters, its replay
   marker, anything else under T's hash tag), and T's dead-letter count.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.errors import KafkaUnavailable, UsageError
from keel.kafka import TopicSpec, ensure_topics, group_offsets, topic_exists
from keel.keystore_pg import open_key_store, require_key_store
from keel.privacy_commands import check_offboard_arguments, offboard_receipt, offboard_receipt_id
from keel.times import format_time, now_micros
from keel.wire import events_topic, group_id, record_key

from .offboarded import OffboardedSet, drop_tenant_keys
from .publish import send_records
from .replay_scan import end_offsets, partition_count, tenant_partition

SETTLE_S = 30.0


@dataclass
class OffboardReport:
    tenant: str
    first: bool                 # this call offboarded the tenant (False: it was offboarded before)
    at: str                     # when
    keys: int                   # keys shredded
    receipt: str
    produced: bool              # the receipt was produced by this call
    settled: bool               # the workers' group committed past the receipt before the keys were dropped
    dropped: int                # Redis keys dropped by this call

    def summary(self) -> str:
        what = "offboarded" if self.first else f"already offboarded at {self.at}"
        keys = f"{self.keys} key" if self.keys == 1 else f"{self.keys} keys"
        sent = "produced to the topic" if self.produced else "already in the log"
        settled = ("" if self.settled else "; no worker passed the receipt yet (its records are refused from its "
                   "next batch on)")
        return (f"tenant {self.tenant}: {what} ({keys} shredded); receipt {self.receipt} {sent}; "
                f"{self.dropped} Redis key(s) dropped{settled}")


def offboard_in_stream(cartridge: Cartridge, settings: Settings, tenant: str, reason: str | None = None, *,
                       settle_s: float = SETTLE_S) -> OffboardReport:
    check_offboard_arguments(tenant, reason)
    if not settings.redis_url:
        raise UsageError("Redis/Kafka mode drops the tenant's keys in Redis: pass --redis URL")
    keys = None
    if cartridge.spec.personal:
        require_key_store([cartridge], settings)
        keys = open_key_store(keys_file=settings.keys_file, keys_dsn=settings.keys_dsn,
                              master_file=settings.master_key_file)
    try:
        shredded = None if keys is None else keys.offboard(tenant, reason=reason)
    finally:
        close = getattr(keys, "close", None)        # the PostgreSQL store's connection (a key file has none)
        if close is not None:
            close()
    store = open_redis_store(cartridge, settings)
    try:
        offboarded = OffboardedSet(store)
        known = offboarded.get(tenant)
        first = known is None
        if known is None:
            at = str(shredded["at"]) if shredded is not None else format_time(now_micros())
            known = {"at": at, "keys": int(shredded["keys"]) if shredded is not None else 0,
                     "receipt": offboard_receipt_id(tenant, at), "produced": False, "dropped": False}
            if reason is not None:
                known["reason"] = reason
            offboarded.put(tenant, known)
        produced = False
        topic = events_topic(cartridge.name)
        if not known.get("produced"):
            envelope = offboard_receipt(tenant, known["at"], known["keys"], known.get("reason"))
            value = json.dumps(envelope, ensure_ascii=False, separators=(",", ":")).encode()
            asyncio.run(_produce(settings.kafka_bootstrap, topic, [(record_key(tenant), value)]))
            offboarded.put(tenant, {**known, "produced": True})
            produced = True
        settled = _settle(settings.kafka_bootstrap, topic, group_id(cartridge.name), tenant, settle_s)
        dropped = drop_tenant_keys(store, tenant)
        offboarded.put(tenant, {**known, "produced": True, "dropped": True})
    finally:
        store.close()
    return OffboardReport(tenant, first, known["at"], int(known["keys"]), known["receipt"], produced, settled,
                          dropped)


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    await ensure_topics(bootstrap, [topic], TopicSpec())
    await send_records(bootstrap, topic, records)


def _settle(bootstrap: str, topic: str, group: str, tenant: str, settle_s: float) -> bool:
    """Wait until the group committed past the tenant's partition's end as it is now (the receipt included);
    False when it did not within `settle_s`, or stopped moving for 5 s (no worker running)."""
    async def positions() -> tuple[int, int | None]:
        if not await topic_exists(bootstrap, topic):
            return 0, None
        partition = tenant_partition(tenant, await partition_count(bootstrap, topic))
        end = (await end_offsets(bootstrap, topic, [partition]))[partition]
        committed = {p.partition: p.committed for p in await group_offsets(bootstrap, topic, group)}
        return end, committed.get(partition)

    deadline, still_since, last = time.monotonic() + settle_s, time.monotonic(), None
    try:
        end, committed = asyncio.run(positions())
    except KafkaUnavailable:
        return False
    while True:
        if committed is not None and committed >= end:
            return True
        now = time.monotonic()
        if committed != last:
            last, still_since = committed, now
        if now >= deadline or now - still_since >= 5.0:
            return False
        time.sleep(0.3)
        try:
            _, committed = asyncio.run(positions())     # (the end as it was: later records do not matter)
        except KafkaUnavailable:
            return False
