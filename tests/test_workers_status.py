"""`keel status` shaping without services: owners, stalled members, an empty group, services that cannot be
read, and dead letters of every writer (duplicates folded, redriven ones closed, the last hour)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from aiokafka.partitioner import DefaultPartitioner

from keel.deadletters import fold
from keel.kafka import GroupDescription, GroupMember, PartitionOffsets
from keel.wire import REDRIVEN, partition_for
from workers.status import commit_metadata, render_status, shape_status

NOW = 1_800_000_000.0


def test_partition_of_a_tenant_is_kafkas_default_partitioner() -> None:
    partitioner = DefaultPartitioner()
    parts = list(range(8))
    for tenant in ("hogar-demo", "salon-lucia", "tenant-00042", "a"):
        assert partition_for(tenant, 8) == partitioner(tenant.encode(), parts, parts)


def record(partition: int, offset: int, at_s: float, headers: dict[str, str]) -> SimpleNamespace:
    return SimpleNamespace(partition=partition, offset=offset, timestamp=int(at_s * 1000), key=None, value=b"{}",
                           headers=[(k, v.encode()) for k, v in headers.items()])


def worker_letter(offset: int, tenant: str, source_offset: int) -> dict[str, str]:
    return {"keel.reason": "bad", "keel.tenant": tenant, "keel.source.topic": "keel.finance.events",
            "keel.source.partition": "0", "keel.source.offset": str(source_offset)}


def test_dead_letters_of_every_writer_counted_once_and_closed_by_a_redrive() -> None:
    dead = fold([
        record(0, 0, NOW - 7200, worker_letter(0, "a", 5)),
        record(0, 1, NOW - 7100, worker_letter(1, "a", 5)),                # the same source record again
        record(1, 0, NOW - 60, {"keel.reason": "bad row", "keel.tenant": "b", "keel.source": "outbox",
                                "keel.source.table": "outbox", "keel.source.position": "17"}),
        record(1, 1, NOW - 30, {"keel.reason": "bad body", "keel.source": "webhook"}),
        record(0, 2, NOW - 10, {REDRIVEN: "0:0", "keel.redriven_at": "2027-01-15T08:00:00Z"}),
    ])
    summary = dead.summary(int(NOW * 1000))
    assert summary == {"total": 3, "open": 2, "redriven": 1, "last_hour": 2, "by_tenant": {"": 1, "b": 1},
                       "by_writer": {"outbox": 1, "webhook": 1, "worker": 1}}


def test_owners_stalled_partitions_and_problems() -> None:
    fresh, old = commit_metadata("keel-worker-h1-1"), commit_metadata("keel-worker-h2-2")
    old = old.replace(old.split('"at":')[1].rstrip("}"), str(NOW - 600))
    fresh = fresh.replace(fresh.split('"at":')[1].rstrip("}"), str(NOW - 5))
    partitions = [PartitionOffsets(0, 10, 10, 0, fresh), PartitionOffsets(1, 90, 40, 50, old),
                  PartitionOffsets(2, 7, None, 7)]
    group = GroupDescription("Stable", (GroupMember("m1", "keel-worker-h1-1", "/10.0.0.1", (0, 2)),
                                        GroupMember("m2", "keel-worker-h2-2", "/10.0.0.2", (1,))))
    doc = shape_status("finance", partitions, group, {"a": {"0": 9}}, fold([]), {}, {}, now=NOW)
    assert doc["lag"] == 57
    rows = {p["partition"]: p for p in doc["partitions"]}
    assert rows[0]["owner"]["client_id"] == "keel-worker-h1-1" and not rows[0]["stalled"]
    assert rows[1]["owner"] == {"member_id": "m2", "client_id": "keel-worker-h2-2", "host": "/10.0.0.2"}
    assert rows[1]["stalled"] and rows[1]["last_commit_age_s"] == 600
    assert not rows[2]["stalled"]                     # never committed: nothing to judge by
    [problem] = doc["problems"]
    assert "partition 1" in problem and "stopped consuming" in problem and "keel-worker-h2-2" in problem
    text = render_status(doc)
    assert "STALLED" in text and "keel-worker-h1-1@/10.0.0.1" in text and "members: 2" in text
    assert doc["tenants"]["a"] == {"applied_offsets": {"0": 9}, "dead_letters": 0}


def test_a_group_without_members_is_said_plainly() -> None:
    doc = shape_status("finance", [PartitionOffsets(0, 10, 3, 7)], GroupDescription("Empty", ()), {}, fold([]),
                       None, {}, now=NOW)
    assert doc["problems"] == [("the group keel.finance.worker has no members: no worker is consuming "
                               "(7 record(s) wait)")]
    assert "PROBLEM: the group keel.finance.worker has no members" in render_status(doc)


def test_what_cannot_be_read_is_said() -> None:
    doc = shape_status("finance", [], None, {}, None, {"": 2, "a": 1}, {"kafka": "Kafka connect failed"}, now=NOW)
    assert doc["lag"] is None and doc["members"] is None and doc["dead_letters"] is None
    text = render_status(doc)
    assert "CANNOT READ KAFKA: Kafka connect failed" in text and "lag ?" in text
    assert "dead letters counted by workers (Redis; relay/webhook letters not included): 3" in text


def test_keel_status_with_kafka_and_redis_down_says_so_and_exits_3(tmp_path) -> None:
    """Issue 10: with Redis down `keel status` exited 1 and showed no Kafka lag either."""
    import subprocess
    import sys
    from pathlib import Path
    root = Path(__file__).resolve().parents[1]
    out = subprocess.run([sys.executable, "-m", "keel.cli", "status", str(root / "cartridges" / "finance"),
                          "--kafka", "127.0.0.1:1", "--redis", "redis://127.0.0.1:1/0"],
                         capture_output=True, text=True, cwd=root, timeout=120, check=False)
    assert out.returncode == 3, out.stderr
    assert "CANNOT READ KAFKA" in out.stdout and "CANNOT READ REDIS" in out.stdout and "lag ?" in out.stdout


def test_redis_behind_the_log_and_its_causes_come_before_blaming_workers() -> None:
    """Issue 22: after a failover to a lagging replica status said `lag 0, problems []`; with Redis out of memory it
    blamed the worker."""
    from workers.status import RedisPart
    old = commit_metadata("keel-worker-h1-1")
    old = old.replace(old.split('"at":')[1].rstrip("}"), str(NOW - 600))
    partitions = [PartitionOffsets(0, 100, 100, 0, old), PartitionOffsets(1, 90, 40, 50, old)]
    group = GroupDescription("Stable", (GroupMember("m1", "keel-worker-h1-1", "/10.0.0.1", (0, 1)),))
    oom = "Redis is out of memory (…) and refuses writes: raise maxmemory or free memory"
    redis = RedisPart(applied={"a": {"0": None}}, dead_letters={}, watermarks={0: 59, 1: 39}, holds_data=True,
                      condition=oom)
    doc = shape_status("finance", partitions, group, redis.applied, fold([]), {}, {}, now=NOW, redis=redis)
    rows = {p["partition"]: p for p in doc["partitions"]}
    assert (rows[0]["redis_applied"], rows[0]["redis_behind"]) == (59, 40)
    assert (rows[1]["redis_applied"], rows[1]["redis_behind"]) == (39, 0)
    assert doc["problems"][0] == oom
    assert "partition 0: Redis is behind the log by 40 record(s)" in doc["problems"][1]
    stalled = [p for p in doc["problems"] if p.startswith("partition 1: lag 50")]
    assert stalled and "Redis cannot take writes" in stalled[0] and "stopped consuming" not in stalled[0]
    text = render_status(doc)
    assert "@None" not in text and "nothing on p0" in text


def test_redis_holding_nothing_while_the_group_committed_is_a_problem() -> None:
    from workers.status import RedisPart
    redis = RedisPart(watermarks={0: None}, holds_data=False)
    doc = shape_status("finance", [PartitionOffsets(0, 10, 10, 0)], None, {}, None, None, {}, now=NOW, redis=redis)
    assert any(p.startswith("Redis holds nothing of this namespace") for p in doc["problems"])


def test_tenants_without_a_known_partition_never_print_p0_at_none() -> None:
    doc = shape_status("finance", [], None, {"a": {}}, None, None, {"kafka": "down"}, now=NOW)
    text = render_status(doc)
    assert "p0@None" not in text and "partition unknown" in text


def test_a_partition_without_a_watermark_in_a_watermarked_namespace_is_behind_by_its_commit() -> None:
    """A failover to a replica that had some tenants but never a partition's watermark: that partition's committed
    records are all missing (status said nothing, since only partitions with a watermark were compared)."""
    from workers.status import RedisPart
    partitions = [PartitionOffsets(0, 30, 30, 0), PartitionOffsets(1, 20, 20, 0)]
    redis = RedisPart(watermarks={0: 29, 1: None}, holds_data=True, predates_watermarks=False)
    doc = shape_status("finance", partitions, None, {}, None, None, {}, now=NOW, redis=redis)
    rows = {p["partition"]: p for p in doc["partitions"]}
    assert (rows[0]["redis_behind"], rows[1]["redis_behind"]) == (0, 20)
    assert any(p.startswith("partition 1: Redis is behind the log by 20 record(s): it holds no record of it")
               for p in doc["problems"])
    legacy = RedisPart(watermarks={0: 29, 1: None}, holds_data=True, predates_watermarks=True)
    doc = shape_status("finance", partitions, None, {}, None, None, {}, now=NOW, redis=legacy)
    assert doc["partitions"][1]["redis_behind"] is None       # written before watermarks: nothing to compare


# ---- Redis refusing writes, on a real redis-server of the test's own -------------------------------------------

def redis_with_namespace(tmp_path, name: str):
    """(a redis-server on its own port, a cartridge whose namespace it holds, as workers left it, and its
    settings)."""
    from support.redis_nodes import RedisNode
    from support.workers import unique_cartridge

    from keel.cartridge import load_cartridge
    from keel.config import resolve
    from keel.connect import open_redis_store
    node = RedisNode(tmp_path / f"redis-{name}").start()
    cartridge = load_cartridge(unique_cartridge(tmp_path))
    settings = resolve({"redis": node.url, "kafka": "127.0.0.1:1"})
    open_redis_store(cartridge, settings).close()        # the namespace's layout stamp, as any writer leaves it
    return node, cartridge


def squeezed_redis(tmp_path, policy: str):
    """A redis-server on its own port holding a namespace and some data, then told (CONFIG SET maxmemory) to use
    less memory than it does, under `policy`: every write is refused from then on (under volatile-lru too: no key
    has a TTL)."""
    node, cartridge = redis_with_namespace(tmp_path, policy)
    client = node.client()
    for i in range(2000):
        client.set(f"filler:{i}", "x" * 500)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", policy)
    client.config_set("maxmemory", str(used // 2))
    return node, cartridge


def stalled_doc(redis) -> dict:
    """A status document whose partition 1 has lag and an owner that has not committed for 600 s."""
    old = commit_metadata("keel-worker-h1-1")
    old = old.replace(old.split('"at":')[1].rstrip("}"), str(NOW - 600))
    partitions = [PartitionOffsets(0, 100, 100, 0, old), PartitionOffsets(1, 90, 40, 50, old)]
    group = GroupDescription("Stable", (GroupMember("m1", "keel-worker-h1-1", "/10.0.0.1", (0, 1)),))
    return shape_status("finance", partitions, group, redis.applied, fold([]), {}, {}, now=NOW, redis=redis)


@pytest.mark.parametrize("policy", ["noeviction", "volatile-lru"])
def test_status_names_redis_out_of_memory_as_the_cause(tmp_path, kafka_bootstrap: str, policy: str) -> None:
    """Issue 40: against a Redis refusing writes (out of memory) status blamed the worker ("that worker stopped
    consuming"). INFO alone said nothing under a volatile-* policy; Redis's answer to a write is asked too."""
    import redis as redislib

    from keel.config import resolve
    from workers.status import _redis_part
    node, cartridge = squeezed_redis(tmp_path, policy)
    try:
        with pytest.raises(redislib.exceptions.OutOfMemoryError):
            node.client().set("probe:by-the-test", "1")             # Redis does refuse writes
        keys = node.client().dbsize()
        settings = resolve({"redis": node.url, "kafka": kafka_bootstrap})
        redis = _redis_part(cartridge, settings, [], None, True)
        assert redis.condition is not None and redis.condition.startswith("Redis is out of memory ("), redis.condition
        assert f"policy {policy}) and refuses writes" in redis.condition
        assert redis.memory is not None and redis.memory["used"] > redis.memory["maxmemory"] > 0
        doc = stalled_doc(redis)
        assert doc["problems"][0] == redis.condition
        [stalled] = [p for p in doc["problems"] if p.startswith("partition 1: lag 50")]
        assert "Redis cannot take writes, see above" in stalled and "stopped consuming" not in stalled
        assert node.client().get("probe:by-the-test") is None and node.client().dbsize() == keys  # nothing written
    finally:
        node.stop()


def test_keel_status_names_redis_out_of_memory(tmp_path, kafka_bootstrap: str,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """The command itself, on the real Kafka and the squeezed Redis: the first problem names Redis's memory."""
    import json

    from keel.cli import main
    node, cartridge = squeezed_redis(tmp_path, "volatile-lru")
    try:
        code = main(["status", str(cartridge.path), "--redis", node.url, "--kafka", kafka_bootstrap, "--json"])
        doc = json.loads(capsys.readouterr().out)
        assert code == 0 and doc["unavailable"] == {}
        assert doc["problems"][0].startswith("Redis is out of memory (") and "refuses writes" in doc["problems"][0]
        assert doc["redis_memory"]["policy"] == "volatile-lru" and doc["redis_memory"]["oom_refusals"] >= 1
    finally:
        node.stop()


def test_a_batch_refused_for_memory_is_named_although_small_writes_pass(tmp_path, kafka_bootstrap: str) -> None:
    """A batch larger than the room left is refused while small writes still pass (a worker's pipeline at the
    edge of maxmemory): status cannot see it in INFO or in a small write, but Redis counts every OOM answer."""
    import redis as redislib

    from keel.config import resolve
    from workers.status import _redis_part
    node, cartridge = redis_with_namespace(tmp_path, "edge")
    try:
        client = node.client()
        client.config_set("maxmemory", str(int(client.info("memory")["used_memory"]) + (1 << 20)))
        batch = client.pipeline(transaction=False)
        for i in range(100):
            batch.set(f"big:{i}", "x" * 100_000)                   # 10 MB into 1 MB of room
        with pytest.raises(redislib.exceptions.OutOfMemoryError):
            batch.execute()
        redis = _redis_part(cartridge, resolve({"redis": node.url, "kafka": kafka_bootstrap}), [], None, True)
        assert redis.memory is not None and redis.memory["oom_refusals"] >= 1
        [stalled] = [p for p in stalled_doc(redis)["problems"] if p.startswith("partition 1: lag 50")]
        if redis.condition is None:         # the refused batch's memory was given back: small writes pass again
            assert "Redis has refused" in stalled and "for lack of memory since it started" in stalled
            assert stalled.index("Redis has refused") < stalled.index("else that worker stopped consuming")
        else:                               # still over maxmemory when asked
            assert "out of memory" in redis.condition and "Redis cannot take writes" in stalled
    finally:
        node.stop()


def test_keel_status_names_the_default_kafka_it_reads_and_the_redis_it_does_not(tmp_path) -> None:
    """Issue 40: without KEEL_KAFKA_BOOTSTRAP status quietly read 127.0.0.1:9092. It says so, once, on stderr;
    given an address it says nothing; without a Redis URL it says that Redis was not read."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from support.workers import unique_cartridge
    root = Path(__file__).resolve().parents[1]
    cartridge = str(unique_cartridge(tmp_path))
    env = {k: v for k, v in os.environ.items() if k not in ("KEEL_KAFKA_BOOTSTRAP", "KEEL_REDIS_URL")}

    def status(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "keel.cli", "status", cartridge, *extra], capture_output=True,
                              text=True, cwd=root, env=env, timeout=120, check=False)
    out = status("--redis", "redis://127.0.0.1:1/0")
    notice = "keel: using Kafka at 127.0.0.1:9092 (default; set KEEL_KAFKA_BOOTSTRAP or pass --kafka)"
    assert out.stderr.splitlines().count(notice) == 1, out.stderr
    assert "CANNOT READ REDIS" in out.stdout and out.returncode == 3
    out = status("--kafka", "127.0.0.1:1", "--json")
    assert "using Kafka" not in out.stderr and json.loads(out.stdout)["kafka"] == "127.0.0.1:1"
    assert json.loads(out.stdout)["redis"] is None
    out = status("--kafka", "127.0.0.1:1")
    assert "Redis not read (no --redis URL, no KEEL_REDIS_URL)" in out.stdout
