"""The offboarded tenants of a cartridge (keel offboard, docs/privacy.md): a Redis hash outside every tenant's
keys, `keel:{<namespace>}:offboarded`, tenant -> the PII-free record of its offboarding (JSON: when, how many
keys were shredded, the receipt's id, whether the receipt was produced).

Why Redis: every worker and `keel replay` already reads the namespace on every batch, so the set costs one
small read per batch and is seen by every worker from its next batch on; it lives beside the namespace's other
shared keys (the tenant registry, dead-letter counts), in no generation, so a tenant's rebuild never touches
it. It is not the only copy: the `keel.offboarded` receipt in the log names the tenant (a `keel replay` that
meets it records the tenant here again, so a Redis rebuilt from the log refuses the tenant too), and the key
store (PostgreSQL or the key file) keeps its own record, so no key is ever created for the tenant again.

A worker's check (`OffboardedCheck`): each batch reads the hash once; a record keyed by an offboarded tenant is
refused to the dead-letter topic with a reason, its personal fields masked (keel.privacy.masked_line), except
the tenant's receipt itself, which is the offboarding and is passed over.
"""
from __future__ import annotations

import json
from typing import Any

from keel.cartridge import Cartridge
from keel.envelope import OFFBOARDED
from keel.privacy import masked_line
from keel.store.base import Store
from keel.store.redis import RedisStore, dead_letter_keys, guard
from keel.store.roles import BatchWrites

from .records import Record

_RECEIPT = OFFBOARDED.encode()


def offboarded_key(namespace: str) -> str:
    """The hash of a namespace's offboarded tenants (shares the namespace's hash tag, like its registry)."""
    return f"keel:{{{namespace}}}:offboarded"


class OffboardedSet:
    """Reads and writes the offboarded tenants of one namespace through a RedisStore's client."""

    def __init__(self, store: Any) -> None:
        self.namespace: str = store.namespace
        self.client: Any = store.client
        self.key = offboarded_key(self.namespace)

    def all(self) -> dict[str, dict[str, Any]]:
        with guard(self.namespace, "read the offboarded tenants"):
            raw = self.client.hgetall(self.key)
        return {k.decode() if isinstance(k, bytes) else k: json.loads(v) for k, v in raw.items()}

    def get(self, tenant: str) -> dict[str, Any] | None:
        with guard(self.namespace, "read the offboarded tenants", tenant):
            raw = self.client.hget(self.key, tenant)
        return None if raw is None else json.loads(raw)

    def put(self, tenant: str, record: dict[str, Any]) -> None:
        with guard(self.namespace, "record an offboarded tenant", tenant):
            self.client.hset(self.key, tenant, json.dumps(record, sort_keys=True))


def is_receipt(tenant: str, value: bytes | None) -> bool:
    """Whether a record's value is the `keel.offboarded` receipt of `tenant`."""
    if value is None or _RECEIPT not in value:
        return False
    try:
        doc = json.loads(value)
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("type") == OFFBOARDED and doc.get("tenant") == tenant


def refusal_reason(tenant: str, record: dict[str, Any]) -> str:
    return (f"tenant {tenant!r} was offboarded at {record.get('at')} (keel offboard, receipt "
            f"{record.get('receipt')}): its events are refused")


def drop_tenant_keys(store: RedisStore, tenant: str) -> int:
    """Every Redis key of a tenant: its generations and counters (RedisStore.drop_tenant), then whatever else
    its hash tag holds (the replay marker, keys a later version may add), and its dead-letter count."""
    dropped = int(store.drop_tenant(tenant))
    namespace, client = store.namespace, store.client
    prefix = f"keel:{{{namespace}/{tenant}}}:"
    pattern = "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + "*"
    with guard(namespace, "drop the offboarded tenant's keys", tenant):
        rest = list(client.scan_iter(match=pattern, count=1000))
        for start in range(0, len(rest), 500):
            dropped += int(client.unlink(*rest[start:start + 500]))
        client.hdel(dead_letter_keys(namespace)[1], tenant)
    return dropped


def receipt_record(value: bytes) -> dict[str, Any]:
    """The offboarded set's record of a `keel.offboarded` receipt read from the log."""
    doc = json.loads(value)
    payload = doc.get("payload") if isinstance(doc.get("payload"), dict) else {}
    return {"at": doc.get("occurred_at"), "keys": payload.get("keys"), "receipt": doc.get("id"), "produced": True,
            "dropped": False}


class OffboardedCheck:
    """The worker's check (workers/applier.py): `refresh()` once per batch, then `refusal(record)` per record:
    None (go on), or (the value the dead letter keeps, the reason) for a record of an offboarded tenant; the
    tenant's receipt gives ("", "") (passed over, not a dead letter). A durable store that is not Redis (tests,
    embedded) has no offboarded tenants here."""

    def __init__(self, cartridge: Cartridge, durable: Store) -> None:
        self.cartridge = cartridge
        self.set = OffboardedSet(durable) if isinstance(durable, RedisStore) else None
        self.tenants: dict[str, dict[str, Any]] = {}
        self.forget: set[str] = set()       # offboarded tenants whose keys are still to be dropped (`written`)

    def refresh(self) -> None:
        if self.set is not None:
            self.tenants = self.set.all()
            self.forget |= {t for t, r in self.tenants.items() if r.get("dropped") is False}

    def refusal(self, record: Record) -> tuple[bytes | None, str] | None:
        if record.key is None or (not self.tenants and (record.value is None or _RECEIPT not in record.value)):
            return None
        tenant = record.key.decode("utf-8", "replace")
        done = self.tenants.get(tenant)
        if done is None:
            if self.set is None or not is_receipt(tenant, record.value):
                return None
            # a receipt of a tenant the set does not hold: the log re-read after Redis was lost (workers re-apply
            # from the beginning). The tenant is refused from here on; its keys re-applied before the receipt are
            # dropped once this batch is written (`written`).
            assert record.value is not None
            done = self.tenants[tenant] = receipt_record(record.value)
            self.set.put(tenant, done)
            self.forget.add(tenant)
            return b"", ""
        if is_receipt(tenant, record.value):
            return b"", ""
        return masked_line(self.cartridge, record.value), refusal_reason(tenant, done)

    def written(self, writer: BatchWrites) -> None:
        """After a batch is written (the writer thread): drop every key of the tenants to forget; batches are
        written in order and every later one refuses them, so nothing of them is written again."""
        if not self.forget or self.set is None or not isinstance(writer, RedisStore):
            return
        for tenant in sorted(self.forget):
            drop_tenant_keys(writer, tenant)
            record = self.tenants.get(tenant) or self.set.get(tenant) or {}
            self.set.put(tenant, {**record, "dropped": True})
            self.forget.discard(tenant)
