"""`keel status`: how far the workers of a cartridge are, from Kafka (end and committed offsets per
partition, lag) and Redis (each tenant's applied offset, dead letters)."""
from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Any

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.kafka import PartitionOffsets, group_offsets, topic_exists
from keel.wire import dlq_topic, events_topic, group_id, partition_for

from .dlq import DeadLetterCounts

NO_TENANT = ""      # dead letters whose tenant could not be read


def shape_status(cartridge: str, partitions: list[PartitionOffsets], applied: dict[str, dict[int, int | None]],
                 dead: dict[str, int]) -> dict[str, Any]:
    """The `keel status --json` document."""
    tenants = {t: {"applied_offsets": {str(p): off for p, off in sorted(offsets.items())},
                   "dead_letters": dead.get(t, 0)}
               for t, offsets in sorted(applied.items())}
    return {"cartridge": cartridge, "topic": events_topic(cartridge), "dlq": dlq_topic(cartridge),
            "group": group_id(cartridge), "lag": sum(p.lag for p in partitions),
            "partitions": [asdict(p) for p in partitions], "tenants": tenants,
            "dead_letters": sum(dead.values()),
            "dead_letters_without_tenant": dead.get(NO_TENANT, 0)}


def gather_status(cartridge: Cartridge, settings: Settings, *, tenant: str | None = None,
                  per_tenant: bool = True) -> dict[str, Any]:
    """Read Kafka (and Redis when configured) and shape the status document; `tenant` limits the per-tenant
    part to one tenant, `per_tenant=False` skips it (one Redis read per tenant)."""
    topic = events_topic(cartridge.name)
    partitions: list[PartitionOffsets] = []
    if asyncio.run(topic_exists(settings.kafka_bootstrap, topic)):
        partitions = asyncio.run(group_offsets(settings.kafka_bootstrap, topic, group_id(cartridge.name)))
    applied: dict[str, dict[int, int | None]] = {}
    dead: dict[str, int] = {}
    if settings.redis_url:
        store = open_redis_store(cartridge, settings)
        try:
            dead = DeadLetterCounts(store.client, cartridge.name).counts()
            tenants = [] if not per_tenant else [tenant] if tenant else store.tenants()
            for t in tenants:
                p = partition_for(t, len(partitions)) if partitions else 0
                applied[t] = {p: store.applied_offset(t, topic, p)}
        finally:
            store.close()
    return shape_status(cartridge.name, partitions, applied, dead)


def render_status(doc: dict[str, Any]) -> str:
    """A short human-readable status."""
    lines = [f"{doc['topic']}  group {doc['group']}  lag {doc['lag']}"]
    if doc["partitions"]:
        lines.append(f"  {'partition':>9} {'end':>12} {'committed':>12} {'lag':>10}")
        for p in doc["partitions"]:
            committed = "-" if p["committed"] is None else p["committed"]
            lines.append(f"  {p['partition']:>9} {p['end']:>12} {committed:>12} {p['lag']:>10}")
    else:
        lines.append("  (topic not created yet: publish or start a worker)")
    tenants = doc["tenants"]
    if tenants:
        lines.append(f"tenants in Redis: {len(tenants)}")
        for t, info in list(tenants.items())[:20]:
            offsets = ", ".join(f"p{p}@{o}" for p, o in info["applied_offsets"].items())
            extra = f", {info['dead_letters']} dead letter(s)" if info["dead_letters"] else ""
            lines.append(f"  {t}: applied {offsets}{extra}")
        if len(tenants) > 20:
            lines.append(f"  … {len(tenants) - 20} more (--json for all, --tenant T for one)")
    lines.append(f"dead letters: {doc['dead_letters']} in {doc['dlq']}"
                 + (f" ({doc['dead_letters_without_tenant']} without a readable tenant)"
                    if doc["dead_letters_without_tenant"] else ""))
    return "\n".join(lines)
