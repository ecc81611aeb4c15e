"""`keel status`: how far the workers of a cartridge are, and what is wrong, from what can be read.

Kafka: per partition the log end, the worker group's committed offset, lag, its owner (group member:
client id, host) and when it last committed (the worker stores who and when with each offset commit);
the group's members; the dead-letter topic (every writer: workers, relay, webhook), total, open (not
redriven) and the last hour. Redis: each tenant's applied offset. Either may be down: what cannot be read
is said (`unavailable`) and the command exits EXIT_PARTIAL instead of 0. `problems` says in plain words
what an operator must look at: no member in the group, a partition with lag whose owner stopped
committing, dead letters arriving. Whether Redis refuses writes (out of memory, read-only, …) is asked of Redis
itself, with a write that changes nothing (`redis_condition`), before any worker is blamed for a stall.
"""
from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from redis.exceptions import OutOfMemoryError, ReadOnlyError, ResponseError

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.deadletters import DeadLetters, read_dead_letters
from keel.errors import EXIT_UNAVAILABLE, KafkaUnavailable, StoreUnavailable
from keel.kafka import GroupDescription, PartitionOffsets, describe_group, group_offsets, topic_exists
from keel.store.redis.connection import redacted
from keel.store.redis.transport import is_oom
from keel.wire import dlq_topic, events_topic, group_id, partition_for

from .archive import status_of as cold_status
from .dlq import DeadLetterCounts
from .offboarded import OffboardedSet

NO_TENANT = ""      # dead letters whose tenant could not be read
EXIT_PARTIAL = EXIT_UNAVAILABLE    # Kafka or Redis could not be read: the status printed is partial
KAFKA_TIMEOUT_S = 15.0
STALLED_AFTER_S = 60.0


def commit_metadata(client_id: str, *, held: dict[str, Any] | None = None) -> str:
    """What a worker stores with each offset commit: who committed, and when (seconds since the epoch); `held`:
    the partition is stopped at the committed offset, a record of a version newer than the worker's cartridge
    knows ({offset, type, version, known})."""
    doc: dict[str, Any] = {"by": client_id, "at": round(time.time(), 1)}
    if held is not None:
        doc["held"] = held
    return json.dumps(doc, separators=(",", ":"))


def _last_commit(metadata: str) -> tuple[str | None, float | None]:
    try:
        doc = json.loads(metadata)
        return str(doc["by"]), float(doc["at"])
    except (ValueError, KeyError, TypeError):
        return None, None


def _held(metadata: str, committed: int | None) -> dict[str, Any] | None:
    """The held record the last commit names, if the commit is still at it."""
    try:
        held = json.loads(metadata).get("held")
        return held if isinstance(held, dict) and held.get("offset") == committed else None
    except (ValueError, AttributeError):
        return None


def _partition_rows(partitions: list[PartitionOffsets], group: GroupDescription | None, now: float,
                    stalled_after: float) -> list[dict[str, Any]]:
    owners = {p: m for m in (group.members if group else ()) for p in m.partitions}
    rows = []
    for p in partitions:
        row = asdict(p)
        del row["metadata"]
        owner = owners.get(p.partition)
        by, at = _last_commit(p.metadata)
        row.update(owner=None if owner is None else {"member_id": owner.member_id, "client_id": owner.client_id,
                                                     "host": owner.host},
                   last_commit_by=by, last_commit_age_s=None if at is None else round(now - at, 1))
        row["stalled"] = bool(owner is not None and p.lag > 0 and at is not None and now - at > stalled_after)
        row["held"] = _held(p.metadata, p.committed)
        rows.append(row)
    return rows


def _problems(doc: dict[str, Any], stalled_after: float) -> list[str]:
    out = []
    redis_cause = doc["unavailable"].get("redis") or doc.get("redis_condition")
    if doc.get("redis_condition"):
        out.append(doc["redis_condition"])
    if doc.get("redis_holds_data") is False and any(p["committed"] for p in doc["partitions"]):
        out.append("Redis holds nothing of this namespace but the group committed offsets: Redis lost its data "
                   "(restarted empty, or restored from before the namespace); running workers re-apply every "
                   "partition from the log's beginning (start one if none runs)")
    for p in doc["partitions"]:
        if p.get("redis_behind"):
            held = ("no record of it" if p["redis_applied"] is None else
                    f"the partition through offset {p['redis_applied']}")
            out.append(f"partition {p['partition']}: Redis is behind the log by {p['redis_behind']} record(s): it "
                       f"holds {held}, the group committed "
                       f"{p['committed']} (a failover to a replica that lagged, or an older backup); a running "
                       f"worker re-applies them by itself (start one if none runs)")
    group = doc.get("members")
    if group is not None and not group and doc["lag"]:
        out.append(f"the group {doc['group']} has no members: no worker is consuming ({doc['lag']} record(s) wait)")
    elif group is not None and not group and doc["partitions"]:
        out.append(f"the group {doc['group']} has no members (no worker is running)")
    for p in doc["partitions"]:
        held = p.get("held")
        if held:
            out.append(f"partition {p['partition']}: stopped at offset {held['offset']}, a record of {held['type']} "
                       f"version {held['version']}, newer than the workers' cartridge knows (version "
                       f"{held['known']}); nothing after it is applied until the workers run a cartridge that "
                       f"knows it (deploy it; check it first with `keel validate <cartridge> --kafka`)")
        elif p["stalled"]:
            o = p["owner"]
            memory = doc.get("redis_memory") or {}
            why = ("Redis cannot take writes, see above" if redis_cause else
                   f"Redis has refused {memory['oom_refusals']} command(s) for lack of memory since it started "
                   f"({memory['used']} of maxmemory {memory['maxmemory']} bytes used now): a batch larger than the "
                   f"room left is refused while small writes pass, so that worker is likely retrying one (raise "
                   f"maxmemory or free memory); else that worker stopped consuming"
                   if memory.get("oom_refusals") and memory.get("maxmemory") else
                   "that worker stopped consuming")
            out.append(f"partition {p['partition']}: lag {p['lag']} and no commit for {p['last_commit_age_s']:.0f}s "
                       f"(over {stalled_after:.0f}s) although member {o['client_id']} ({o['host']}) owns it: {why}")
        elif group and p["owner"] is None and p["lag"]:
            out.append(f"partition {p['partition']}: lag {p['lag']} and no owner (the group is rebalancing?)")
    dead = doc.get("dead_letters")
    if isinstance(dead, dict) and dead.get("last_hour"):
        out.append(f"{dead['last_hour']} dead letter(s) in the last hour ({dead['open']} open): `keel dlq list`")
    return out


async def _kafka_part(cartridge: Cartridge, settings: Settings) -> tuple[list[PartitionOffsets],
                                                                        GroupDescription | None, DeadLetters]:
    topic, bootstrap = events_topic(cartridge.name), settings.kafka_bootstrap
    partitions: list[PartitionOffsets] = []
    group = None
    if await topic_exists(bootstrap, topic):
        partitions = await group_offsets(bootstrap, topic, group_id(cartridge.name))
        group = await describe_group(bootstrap, group_id(cartridge.name), topic)
    dead = DeadLetters()
    if await topic_exists(bootstrap, dlq_topic(cartridge.name)):
        dead = await read_dead_letters(bootstrap, dlq_topic(cartridge.name))
    return partitions, group, dead


def gather_status(cartridge: Cartridge, settings: Settings, *, tenant: str | None = None,
                  per_tenant: bool = True, stalled_after: float = STALLED_AFTER_S) -> dict[str, Any]:
    """Read Kafka and Redis (each as far as it can) and shape the status document; `tenant` limits the
    per-tenant part to one tenant, `per_tenant=False` skips it (one Redis read per tenant)."""
    name = cartridge.name
    unavailable: dict[str, str] = {}
    partitions: list[PartitionOffsets] = []
    group: GroupDescription | None = None
    dead: DeadLetters | None = None
    try:
        partitions, group, dead = asyncio.run(asyncio.wait_for(_kafka_part(cartridge, settings), KAFKA_TIMEOUT_S))
    except (KafkaUnavailable, TimeoutError) as e:
        unavailable["kafka"] = str(e) or f"no answer from {settings.kafka_bootstrap} within {KAFKA_TIMEOUT_S:.0f}s"
    redis = RedisPart()
    if settings.redis_url:
        try:
            redis = _redis_part(cartridge, settings, partitions, tenant, per_tenant)
        except StoreUnavailable as e:
            unavailable["redis"] = str(e)
    doc = shape_status(name, partitions, group, redis.applied, dead, redis.dead_letters, unavailable,
                       now=time.time(), stalled_after=stalled_after, redis=redis)
    doc["kafka"] = settings.kafka_address            # what was read: the addresses (a Redis URL's password hidden)
    doc["redis"] = redacted(settings.redis_url) if settings.redis_url else None
    if cartridge.spec.sources:                       # change data capture: where `keel cdc relay` is (docs/ingress.md)
        from keel.ingress.cdc_status import status_part
        doc["cdc"] = status_part(name, settings.kafka_bootstrap, KAFKA_TIMEOUT_S)
    return doc


def shape_status(name: str, partitions: list[PartitionOffsets], group: GroupDescription | None,
                 applied: dict[str, dict[str, int | None]], dead: DeadLetters | None,
                 redis_counts: dict[str, int] | None, unavailable: dict[str, str], *, now: float,
                 stalled_after: float = STALLED_AFTER_S, redis: RedisPart | None = None) -> dict[str, Any]:
    """The `keel status --json` document (None where a service could not be read)."""
    redis = redis or RedisPart()
    doc: dict[str, Any] = {
        "cartridge": name, "topic": events_topic(name), "dlq": dlq_topic(name), "group": group_id(name),
        "lag": sum(p.lag for p in partitions) if "kafka" not in unavailable else None,
        "group_state": group.state if group else None,
        "members": None if group is None else [asdict(m) for m in group.members],
        "partitions": _partition_rows(partitions, group, now, stalled_after),
        "tenants": {t: {"applied_offsets": offsets} for t, offsets in sorted(applied.items())},
        "dead_letters": dead.summary(int(now * 1000)) if dead is not None else None,
        "dead_letters_counted_by_workers": redis_counts,
        "unavailable": unavailable,
        "redis_condition": redis.condition,
        "redis_memory": redis.memory,
        "redis_holds_data": redis.holds_data,
        "offboarded": None if redis.offboarded is None else {
            t: {k: v for k, v in info.items() if k in ("at", "keys", "receipt")}
            for t, info in sorted(redis.offboarded.items())},
        "cold_tier": redis.cold}
    for row in doc["partitions"]:
        applied_through = redis.watermarks.get(row["partition"])
        row["redis_applied"] = applied_through
        if row["committed"] is None:
            row["redis_behind"] = None
        elif applied_through is not None:
            row["redis_behind"] = max(0, row["committed"] - applied_through - 1)
        else:     # no watermark: nothing of it is held, unless written before watermarks (or all is gone, below)
            row["redis_behind"] = row["committed"] if redis.holds_data and redis.predates_watermarks is False else None
    # Redis behind the log as its own figure (issue 44): `lag` is the log end minus the group's commit, and after a
    # failover to a lagging replica the commit is ahead of Redis: lag 0 hid the records Redis lost
    behind = [row["redis_behind"] for row in doc["partitions"] if row["redis_behind"] is not None]
    doc["redis_behind"] = sum(behind) if behind else None
    if dead is not None:
        for info in doc["tenants"].values():
            info["dead_letters"] = 0
        for t, n in doc["dead_letters"]["by_tenant"].items():
            if t in doc["tenants"]:
                doc["tenants"][t]["dead_letters"] = n
    doc["problems"] = _problems(doc, stalled_after)
    return doc


@dataclass
class RedisPart:
    """What `keel status` reads of Redis (plain reads, no MULTI: they work while Redis is out of memory)."""
    applied: dict[str, dict[str, int | None]] = field(default_factory=dict)   # tenant -> {partition: offset}
    dead_letters: dict[str, int] | None = None
    watermarks: dict[int, int | None] = field(default_factory=dict)           # partition -> applied through
    holds_data: bool | None = None
    predates_watermarks: bool | None = None      # Store.predates_watermarks
    condition: str | None = None                 # refuses writes: out of memory, read-only (redis_condition)
    memory: dict[str, Any] | None = None         # used, maxmemory, policy, oom_refusals (INFO memory, errorstats)
    offboarded: dict[str, dict[str, Any]] | None = None      # tenant -> its offboarding (workers/offboarded.py)
    cold: dict[str, Any] | None = None           # the cold tier's sizes and the mover's last pass (workers/archive.py)


def _redis_part(cartridge: Cartridge, settings: Settings, partitions: list[PartitionOffsets], tenant: str | None,
                per_tenant: bool) -> RedisPart:
    """Per tenant, its applied offset on the partition its name maps to (only when Kafka said how many
    partitions there are); the partitions' watermarks; whether the namespace holds anything; the condition."""
    topic = events_topic(cartridge.name)
    store = open_redis_store(cartridge, settings)
    try:
        part = RedisPart(dead_letters=DeadLetterCounts(store.client, cartridge.name).counts(),
                         condition=redis_condition(store), memory=redis_memory(store),
                         holds_data=store.holds_data(), predates_watermarks=store.predates_watermarks())
        part.watermarks = store.partitions_applied(topic, [p.partition for p in partitions])
        part.offboarded = OffboardedSet(store).all()
        part.cold = cold_status(store, settings)
        tenants = [] if not per_tenant else [tenant] if tenant else store.tenants()
        for t in tenants:
            if partitions:
                p = partition_for(t, len(partitions))
                part.applied[t] = {str(p): store.applied_offset(t, topic, p)}
            else:                                 # Kafka unreadable: which partition is unknown
                part.applied[t] = {}
        return part
    finally:
        store.close()


# A script that may write (no `no-writes` flag) and writes nothing: Redis 7 refuses it before running it exactly
# when it refuses writes (out of memory under any maxmemory policy, a read-only replica, failing RDB snapshots,
# too few replicas), and otherwise it changes nothing.
WRITE_PROBE = "#!lua\nreturn 1"
REFUSALS = {"OOM": "out of memory", "READONLY": "read-only", "MISCONF": "failing to save its snapshots (MISCONF)",
            "NOREPLICAS": "without the replicas min-replicas-to-write asks for (NOREPLICAS)"}


def redis_condition(store: Any) -> str | None:
    """Why Redis refuses Keel's writes although it answers, or None: what Redis says to a write now (the probe
    above), else RedisStore.condition's reading of INFO. `INFO memory` alone missed it: at maxmemory under a
    `volatile-*` policy with no key to evict Redis refuses writes as under noeviction."""
    refused = write_refusal(store.client)
    if refused is None:
        return store.condition()
    if refused == "OOM":
        m = redis_memory(store)
        used = "" if m is None else (f" ({m['used']} of maxmemory {m['maxmemory']} bytes used, policy "
                                     f"{m['policy']})")
        return (f"Redis is out of memory{used} and refuses writes: raise maxmemory or free memory; workers resume "
                f"by themselves")
    if refused == "READONLY":
        return store.condition() or ("Redis is a read-only replica: point Keel at the primary, or use a "
                                     "redis+sentinel:// URL to follow failovers")
    return f"Redis refuses writes, {REFUSALS[refused]}: see its log; workers resume by themselves once it takes them"


def write_refusal(client: Any) -> str | None:
    """The kind of refusal (a key of REFUSALS) Redis answers a write with now, or None when it would take it (or
    the probe cannot tell: an older Redis, a Cluster client, a lost connection; the INFO reading stands)."""
    try:
        client.eval(WRITE_PROBE, 0)
    except OutOfMemoryError:
        return "OOM"
    except ReadOnlyError:
        return "READONLY"
    except ResponseError as e:
        return next((kind for kind in REFUSALS if str(e).startswith(kind) or is_oom(e) and kind == "OOM"), None)
    except Exception:  # noqa: BLE001 - the probe only adds to what INFO says; any other failure tells nothing
        return None
    return None


def redis_memory(store: Any) -> dict[str, Any] | None:
    """used, maxmemory, policy and oom_refusals (commands Redis answered OOM since it started: errorstat_OOM),
    of one node; None when INFO cannot be read that way (a Cluster client answers per node)."""
    try:
        info = store.client.info("memory")
        errors = store.client.info("errorstats")
    except Exception:  # noqa: BLE001 - an addition to the status; RedisStore.condition reports the outage
        return None
    if "used_memory" not in info:
        return None
    oom = errors.get("errorstat_OOM")
    return {"used": int(info["used_memory"]), "maxmemory": int(info.get("maxmemory", 0)),
            "policy": info.get("maxmemory_policy"),
            "oom_refusals": int(oom.get("count", 0)) if isinstance(oom, dict) else 0}


def render_status(doc: dict[str, Any]) -> str:
    """A short human-readable status."""
    lag = "?" if doc["lag"] is None else doc["lag"]
    behind = f"  Redis behind the log {doc['redis_behind']}" if doc.get("redis_behind") else ""
    lines = [f"{doc['topic']}  group {doc['group']} ({doc['group_state'] or 'unknown'})  lag {lag}{behind}"]
    for what, why in doc["unavailable"].items():
        lines.append(f"  CANNOT READ {what.upper()}: {why}")
    if "redis" in doc and doc["redis"] is None:
        lines.append("  Redis not read (no --redis URL, no KEEL_REDIS_URL): tenants, watermarks and whether Redis "
                     "takes writes are unknown")
    if doc["members"] is not None:
        lines.append(f"  members: {len(doc['members'])}"
                     + "".join(f"\n    {m['client_id']} at {m['host']}: partitions {list(m['partitions'])}"
                               for m in doc["members"]))
    if doc["partitions"]:
        lines.append(f"  {'partition':>9} {'end':>12} {'committed':>12} {'lag':>10}  {'owner':<34} last commit")
        for p in doc["partitions"]:
            committed = "-" if p["committed"] is None else p["committed"]
            owner = "-" if p["owner"] is None else f"{p['owner']['client_id']}@{p['owner']['host']}"
            age = "-" if p["last_commit_age_s"] is None else f"{p['last_commit_age_s']:.0f}s ago"
            flag = "  HELD (newer version)" if p.get("held") else "  STALLED" if p["stalled"] else ""
            lines.append(f"  {p['partition']:>9} {p['end']:>12} {committed:>12} {p['lag']:>10}  {owner:<34} {age}{flag}")
    elif "kafka" not in doc["unavailable"]:
        lines.append("  (topic not created yet: publish or start a worker)")
    tenants = doc["tenants"]
    if tenants:
        lines.append(f"tenants in Redis: {len(tenants)}")
        for t, info in list(tenants.items())[:20]:
            offsets = ", ".join(f"p{p}@{o}" if o is not None else f"nothing on p{p}"
                                for p, o in info["applied_offsets"].items()) or "partition unknown (Kafka unread)"
            extra = f", {info['dead_letters']} open dead letter(s)" if info.get("dead_letters") else ""
            lines.append(f"  {t}: applied {offsets}{extra}")
        if len(tenants) > 20:
            lines.append(f"  … {len(tenants) - 20} more (--json for all, --tenant T for one)")
    for t, info in (doc.get("offboarded") or {}).items():
        lines.append(f"offboarded: {t} at {info.get('at')} (receipt {info.get('receipt')}; its events are refused)")
    cold = doc.get("cold_tier")
    if cold:
        lines.append(_cold_line(cold))
    dead = doc["dead_letters"]
    if dead is not None:
        writers = ", ".join(f"{w} {n}" for w, n in dead["by_writer"].items())
        lines.append(f"dead letters in {doc['dlq']}: {dead['open']} open, {dead['total']} total"
                     f"{f' ({writers})' if writers else ''}, {dead['last_hour']}/h in the last hour"
                     + (f"; {dead['by_tenant'].get(NO_TENANT, 0)} open without a readable tenant"
                        if dead["by_tenant"].get(NO_TENANT) else ""))
    elif doc["dead_letters_counted_by_workers"] is not None:
        lines.append(f"dead letters counted by workers (Redis; relay/webhook letters not included): "
                     f"{sum(doc['dead_letters_counted_by_workers'].values())}")
    if doc.get("cdc"):
        from keel.ingress.cdc_status import render_position
        lines += render_position(doc["cdc"])
    for problem in doc["problems"]:
        lines.append(f"PROBLEM: {problem}")
    return "\n".join(lines)


def _cold_line(cold: dict[str, Any]) -> str:
    """The cold tier in a few words: Redis's closed segments, PostgreSQL's rows, what waits, the last error."""
    if not cold.get("configured"):
        text = "cold tier: NOT CONFIGURED in this process (KEEL_COLD_DSN), though the namespace uses one"
    else:
        rows = cold.get("cold_rows")
        text = (f"cold tier: {rows:,} segment(s), {cold.get('cold_bytes', 0):,} bytes "
                f"({cold.get('cold_disk_bytes', 0):,} on disk) in PostgreSQL" if rows is not None
                else f"cold tier: PostgreSQL UNREADABLE: {cold.get('cold_unavailable')}")
    text += (f"; in Redis {cold.get('hot_closed', '?')} closed segment(s), {cold.get('hot_closed_bytes', '?')} bytes; "
             f"waiting to move {cold.get('waiting', '?')} ({cold.get('waiting_bytes', '?')} bytes); "
             f"last pass {cold.get('last_pass_at', 'never')}")
    if cold.get("error"):
        text += f"\n  LAST MOVE ERROR at {cold.get('error_at')}: {cold['error']}"
    return text
