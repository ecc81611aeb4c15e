"""The Redis layout version: stamped on a new namespace, checked by every process at start; a namespace in the
removed layouts 1 and 2 (or an unknown one) is refused with a message saying what to run, and rewritten by `keel
replay --all` (real Redis and Kafka)."""
from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import redis
from support.workers import (
    WorkerProcess,
    embedded_digests,
    keel,
    redis_digests,
    services,
    services_env,
    unique_cartridge,
    wait_applied,
)

from keel.cartridge import load_cartridge
from keel.config import resolve
from keel.errors import UsageError
from keel.store.redis import RedisStore
from keel.store.redis.event_ids import unpack_mark
from keel.store.redis.keys import BUCKETS, IDS, TenantKeys, escape, layout_key, registry_key, watermarked_key
from keel.store.redis.layout import LAYOUT_VERSION, LayoutIncompatible

pytestmark = [services, pytest.mark.timeout(300)]


@pytest.fixture
def env() -> dict[str, str]:
    return services_env()


def test_a_new_namespace_is_stamped_and_another_version_refused(env: dict[str, str]) -> None:
    url = env["KEEL_REDIS_URL"]
    ns = f"lay{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        RedisStore.from_url(url, namespace=ns).close()
        assert client.get(layout_key(ns)) == str(LAYOUT_VERSION)
        client.set(layout_key(ns), LAYOUT_VERSION + 1)
        with pytest.raises(LayoutIncompatible, match="written by a newer Keel"):
            RedisStore.from_url(url, namespace=ns)
        client.set(layout_key(ns), LAYOUT_VERSION - 1)
        with pytest.raises(LayoutIncompatible, match=r"keel replay <cartridge folder> --all"):
            RedisStore.from_url(url, namespace=ns)
        RedisStore.from_url(url, namespace=ns, upgrading_layout=True).close()     # the replay may open it
    finally:
        client.delete(layout_key(ns))
        client.close()


def test_the_layout_setting_of_layout_1_is_refused(env: dict[str, str], tmp_path: Path) -> None:
    """KEEL_REDIS_LAYOUT chose between two layouts; with one left, a process told to use layout 1 refuses (exit 2,
    saying to unset it) rather than let its operator believe layout 1 is in use; "2" is accepted."""
    folder = unique_cartridge(tmp_path)
    proc = keel("status", str(folder), env={**env, "KEEL_REDIS_LAYOUT": "1"}, check=False, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "unset KEEL_REDIS_LAYOUT" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    with pytest.raises(UsageError, match="unset KEEL_REDIS_LAYOUT"):
        resolve({}, {"KEEL_REDIS_LAYOUT": "1"})
    assert resolve({}, {"KEEL_REDIS_LAYOUT": "2"}) == resolve({}, {})


def test_processes_refuse_an_old_layout_and_replay_all_upgrades_it(env: dict[str, str], tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    ns = load_cartridge(folder).name
    client = redis.Redis.from_url(env["KEEL_REDIS_URL"], decode_responses=True)
    try:
        keel("publish", str(folder), str(folder / "events.jsonl"), env=env)
        client.set(layout_key(ns), LAYOUT_VERSION - 1)
        for args in (["worker", str(folder), "--quiet"], ["status", str(folder)],
                     ["digest", str(folder), "--tenant", "hogar-demo", "--redis", env["KEEL_REDIS_URL"]]):
            proc = keel(*args, env=env, check=False, timeout=120)
            assert proc.returncode == 2, (args, proc.stdout, proc.stderr)
            assert f"Redis namespace '{ns}' is in key layout {LAYOUT_VERSION - 1}" in proc.stderr
            assert "keel replay <cartridge folder> --all" in proc.stderr
        keel("replay", str(folder), "--all", "--quiet", env=env)
        assert client.get(layout_key(ns)) == str(LAYOUT_VERSION)
        assert keel("status", str(folder), env=env).returncode == 0
    finally:
        client.delete(layout_key(ns))
        client.close()


@pytest.mark.parametrize("old", [1, 2])
def test_replay_all_rewrites_an_old_layout_namespace(env: dict[str, str], tmp_path: Path, old: int) -> None:
    """The documented upgrades from layouts 1 and 2: a namespace stamped 1 whose generations hold layout 1's keys
    (a sorted set `z:` and an index list `x:` per entity, the provenance list `pv`), or stamped 2 whose event ids
    are in one set `ev` and their marks in one hash `eh` (each written here as that layout named them). Processes
    refuse it with one line naming the replay; the replay is refused while a worker runs, and for some tenants
    only; with the workers stopped, `keel replay --all` rebuilds every tenant from the log (old keys gone, digests
    as embedded, every event id applied and marked again), stamps the namespace, and a worker started again goes
    on from there (the same events again are all duplicates)."""
    folder = unique_cartridge(tmp_path)
    ns = load_cartridge(folder).name
    events = folder / "events.jsonl"
    client = redis.Redis.from_url(env["KEEL_REDIS_URL"], decode_responses=True)
    try:
        keel("publish", str(folder), str(events), env=env)
        worker = WorkerProcess([folder], env, tmp_path / "worker.log")
        try:
            count = sum(1 for line in events.read_text().splitlines() if line.strip())
            wait_applied(folder, env, count, worker)
            store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=ns)
            marks = {t: store.event_marks(t) for t in client.smembers(registry_key(ns))}
            store.close()
            olds = old_layout_keys(client, ns) if old == 1 else layout_2_keys(client, ns)
            client.set(layout_key(ns), old)
            refused = keel("replay", str(folder), "--all", "--quiet", env=env, check=False)
            assert refused.returncode == 2 and "stop the workers" in refused.stderr, refused.stderr
        finally:
            worker.terminate()               # it may have stopped by itself: its namespace turned layout 1
        status = keel("status", str(folder), env=env, check=False, timeout=120)
        assert status.returncode == 2 and len(status.stderr.strip().splitlines()) == 1, status.stderr
        assert f"in key layout {old}" in status.stderr and "keel replay <cartridge folder> --all" in status.stderr
        some = keel("replay", str(folder), "--tenant", "hogar-demo", "--quiet", env=env, check=False)
        assert some.returncode == 2 and "--all" in some.stderr, some.stderr
        assert client.get(layout_key(ns)) == str(old) and client.exists(*olds) == len(olds)
        expected = embedded_digests(load_cartridge(folder), events)
        keel("replay", str(folder), "--all", "--quiet", env=env)
        assert client.get(layout_key(ns)) == str(LAYOUT_VERSION)
        left = [k for k in client.scan_iter(match=f"keel:{{{ns}/*", count=1000)
                if ":z:" in k or ":x:" in k or k.endswith((":pv", ":ev", ":eh", ":ents"))]
        assert left == []
        assert redis_digests(folder, env, expected) == expected
        store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=ns)
        try:                    # the marks again: content hashes, where each event was read from the topic
            assert {t: store.event_marks(t) for t in marks} == marks and all(marks.values())
        finally:
            store.close()
        keel("publish", str(folder), str(events), env=env)           # the same events again: all duplicates
        worker = WorkerProcess([folder], env, tmp_path / "worker2.log")
        try:
            wait_applied(folder, env, 2 * count, worker)
            assert redis_digests(folder, env, expected) == expected
        finally:
            assert worker.terminate() == 0
    finally:
        client.close()


def layout_2_keys(client: redis.Redis, namespace: str) -> list[str]:
    """Layout 2's event ids and marks: each tenant's current generation with its ids moved from layout 3's buckets
    into one set `ev` and its marks, unpacked, into one hash `eh`, as that layout kept them."""
    names = []
    for tenant in client.smembers(registry_key(namespace)):
        keys = TenantKeys(namespace, tenant)
        d = keys.data(int(client.get(keys.gen) or 1))
        packed: dict[str, str] = {}
        buckets = [f"{d}e:{b}" for b in range(int(client.hget(d + "m", BUCKETS) or 1))]
        for bucket in buckets:
            packed.update(client.hgetall(bucket))
        assert packed
        client.delete(*buckets)
        client.hdel(d + "m", IDS, BUCKETS)
        client.sadd(d + "ev", *packed)
        client.hset(d + "eh", mapping={i: unpack_mark(v) for i, v in packed.items() if v})
        client.sadd(d + "ents", *client.hkeys(d + "fr"))      # and its entity set, as layout 1's
        names += [d + "ev", d + "eh", d + "ents"]
    assert names
    return names


def test_a_namespace_begun_with_watermarks_never_resumes_from_a_kafka_commit(env: dict[str, str]) -> None:
    """A partition without a watermark holds nothing, except in a namespace written before watermarks existed:
    a new namespace is marked before its first write (a replica holding some of it has the mark too); a namespace
    that holds tenants and no layout stamp is that older kind (workers/resume.py trusts the commit there)."""
    url = env["KEEL_REDIS_URL"]
    new, old = (f"lay{uuid.uuid4().hex[:10]}" for _ in range(2))
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        store = RedisStore.from_url(url, namespace=new)
        assert client.exists(watermarked_key(new)) and not store.predates_watermarks()
        store.commit_batch("t1", [], ("keel.x.events", 0, 4))
        assert store.holds_data() and not store.predates_watermarks()
        store.drop_namespace()                               # a namespace made again is new: marked again
        assert not client.exists(watermarked_key(new), layout_key(new))
        store.close()
        client.sadd(registry_key(old), "t1")                 # written by a Keel from before the layout stamp
        legacy = RedisStore.from_url(url, namespace=old, upgrading_layout=True)   # as the replay opens it
        assert legacy.predates_watermarks()
        legacy.close()
    finally:
        for ns in (new, old):
            for key in client.scan_iter(match=f"keel:{{{ns}*", count=1000):
                client.delete(key)
        client.close()


def old_layout_keys(client: redis.Redis, namespace: str) -> list[str]:
    """Layout 1's keys, written into the current generation of each tenant of the namespace as that layout named
    them (the replay that converts it must drop them with the old generation)."""
    names = []
    for tenant in client.smembers(registry_key(namespace)):
        keys = TenantKeys(namespace, tenant)
        d = keys.data(int(client.get(keys.gen) or 1))
        entities = client.hkeys(d + "fr")
        entity = escape(min(entities))
        client.sadd(d + "ents", *entities)                 # layouts 1 and 2 kept an entity set
        names += [d + "ents", d + "pv", d + "z:" + entity, d + "x:" + entity]
        client.rpush(d + "pv", '["src","ev",1]')
        client.zadd(d + "z:" + entity, {"e-AAAAAAAA": 0})
        client.rpush(d + "x:" + entity, "1")
    assert names
    return names


def test_a_writer_that_meets_an_emptied_redis_stamps_before_it_registers(env: dict[str, str]) -> None:
    """Redis failing over to a replica that held none of a namespace leaves the running writers with their
    cache of registered tenants and no stamp under them; a writer registering a tenant there stamps the
    namespace first, so the next process opens it instead of taking it for a namespace from before stamps
    (seen in the Sentinel fault test, where `keel status` then refused it as layout 1)."""
    url = env["KEEL_REDIS_URL"]
    ns = f"lay{uuid.uuid4().hex[:10]}"
    client = redis.Redis.from_url(url, decode_responses=True)
    writer = RedisStore.from_url(url, namespace=ns)
    try:
        writer.commit_batch("t1", [([], "e1")], ("keel.x.events", 0, 1))
        for key in client.scan_iter(match=f"keel:{{{ns}*", count=1000):      # the replica promoted held nothing
            client.delete(key)
        writer.commit_batch("t2", [([], "e2")], ("keel.x.events", 0, 2))      # a tenant new to this writer
        assert client.get(layout_key(ns)) == str(LAYOUT_VERSION) and client.exists(watermarked_key(ns))
        later = RedisStore.from_url(url, namespace=ns)                       # opens it, refuses nothing
        assert later.has_event("t2", "e2") and not later.predates_watermarks()
        later.close()
    finally:
        writer.drop_namespace()
        writer.close()
        client.close()
