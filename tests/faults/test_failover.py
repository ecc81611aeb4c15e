"""Issue 22: the state decides where workers resume. Redis failing over to a replica that lagged behind what the
workers had committed to Kafka, and Redis restarted from a backup taken before a wave, must end with every tenant
equal to the embedded build, with `keel status` naming "Redis behind the log" until it is repaired, and no
replay by hand."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from support.mcp_sessions import free_port
from support.probes import get
from support.redis_nodes import RedisNode
from support.replay import count_lines, finance_file, split_file
from support.workers import WorkerProcess, keel, status, unique_cartridge, wait_committed, wait_until

from .conftest import PrivateServices
from .test_faults import judge, wait_done

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]
TENANTS = {f"hogar-{i:02d}": 300 for i in range(12)}


def _behind(doc: dict) -> int:
    return sum(p["redis_behind"] or 0 for p in doc["partitions"])


def wait_repaired(cartridge: Path, env: dict[str, str], expected: int, worker: WorkerProcess) -> None:
    """Every record committed (lag 0) and Redis holding every partition through its commit, at once."""
    def repaired() -> bool:
        if not worker.alive():
            raise AssertionError(f"worker exited:\n{worker.text()}")
        doc = status(cartridge, env)
        return sum(p["end"] for p in doc["partitions"]) >= expected and doc["lag"] == 0 and _behind(doc) == 0 \
            and all(p["redis_applied"] is not None for p in doc["partitions"] if p["end"])
    left = wait_committed(cartridge, env, expected, worker, 240)
    wait_until(repaired, left, "lag 0 and Redis holding the log", interval=0.5, on_timeout=worker.text)


def test_failover_to_a_lagging_replica_is_repaired_from_the_log(tmp_path: Path,
                                                                 private_services: PrivateServices) -> None:
    primary = RedisNode(tmp_path / "primary").start()
    replica = RedisNode(tmp_path / "replica", replica_of=primary).start()
    env = {**private_services.env, "KEEL_REDIS_URL": primary.url}
    cartridge = unique_cartridge(tmp_path, "finance")
    events = finance_file(tmp_path / "events.jsonl", TENANTS)
    first, second = split_file(events, 2)
    try:
        keel("publish", str(cartridge), str(first), "--quiet", env=env)
        worker = WorkerProcess([cartridge], env, tmp_path / "worker1.log", "--batch", "500")
        try:
            wait_done(cartridge, env, count_lines(first), worker)
            primary.wait_in_sync(replica)
            # the replica falls behind from here on. (Pausing it with SIGSTOP was not enough: what the kernel had
            # already buffered on its socket reached it after SIGCONT, and sometimes that was the whole wave.)
            replica.client().execute_command("REPLICAOF", "NO", "ONE")
            keel("publish", str(cartridge), str(second), "--quiet", env=env)
            wait_done(cartridge, env, count_lines(events), worker)
        finally:
            worker.terminate()
        primary.kill()                                    # -9: what the replica never received is gone
        replica.promote()
        promoted = {**env, "KEEL_REDIS_URL": replica.url}
        before = status(cartridge, promoted)
        assert before["lag"] == 0 and _behind(before) > 0, before["partitions"]
        assert any("Redis is behind the log" in p for p in before["problems"]), before["problems"]
        worker = WorkerProcess([cartridge], promoted, tmp_path / "worker2.log")
        try:
            wait_repaired(cartridge, promoted, count_lines(events), worker)
            assert "Redis is behind the log on partition" in worker.text()
        finally:
            worker.terminate()
        judge(cartridge, promoted, events, 0)
        assert not any("behind" in p for p in status(cartridge, promoted)["problems"])
    finally:
        primary.stop()
        replica.stop()


def test_redis_restored_from_an_older_backup_while_the_worker_runs(tmp_path: Path,
                                                                    private_services: PrivateServices) -> None:
    node = RedisNode(tmp_path / "redis").start()
    env = {**private_services.env, "KEEL_REDIS_URL": node.url}
    cartridge = unique_cartridge(tmp_path, "finance")
    events = finance_file(tmp_path / "events.jsonl", TENANTS)
    first, second = split_file(events, 2)
    worker = WorkerProcess([cartridge], env, tmp_path / "worker.log", "--batch", "500")
    try:
        keel("publish", str(cartridge), str(first), "--quiet", env=env)
        wait_done(cartridge, env, count_lines(first), worker)
        node.client().save()
        shutil.copy(node.folder / "dump.rdb", tmp_path / "backup.rdb")     # a backup from before the second wave
        keel("publish", str(cartridge), str(second), "--quiet", env=env)
        wait_done(cartridge, env, count_lines(events), worker)
        node.kill()
        shutil.copy(tmp_path / "backup.rdb", node.folder / "dump.rdb")
        node.start()                                                       # the same address, the older data
        wait_until(lambda: "Redis lost acknowledged writes" in worker.text(), 120,
                   "the worker noticing that Redis went back", on_timeout=worker.text)
        wait_repaired(cartridge, env, count_lines(events), worker)
        worker.terminate()
        judge(cartridge, env, events, 0)
    finally:
        worker.terminate()
        node.stop()


def test_readiness_and_status_tell_redis_out_of_memory_and_kafka_down(tmp_path: Path,
                                                                      private_services: PrivateServices) -> None:
    """/readyz stayed 200 while Redis refused every write and while Kafka was down; `keel status` could not read
    Redis out of memory and blamed the worker."""
    node = RedisNode(tmp_path / "redis").start()
    env = {**private_services.env, "KEEL_REDIS_URL": node.url}
    cartridge = unique_cartridge(tmp_path, "finance")
    events = finance_file(tmp_path / "events.jsonl", {"hogar-a": 400, "hogar-b": 400})
    first, second = split_file(events, 2)
    port = free_port()
    worker = WorkerProcess([cartridge], env, tmp_path / "worker.log", "--metrics-port", str(port),
                           "--unready-after", "2")

    def ready() -> tuple[int, dict]:
        code, body = get(f"http://127.0.0.1:{port}/readyz")
        return code, json.loads(body)
    try:
        keel("publish", str(cartridge), str(first), "--quiet", env=env)
        wait_done(cartridge, env, count_lines(first), worker)
        wait_until(lambda: ready()[0] == 200, 60, "ready", on_timeout=worker.text)
        node.client().config_set("maxmemory", "1")             # every write refused from now on
        keel("publish", str(cartridge), str(second), "--quiet", env=env)
        # Readiness may first say "no outage seen" (the worker had not yet tried a write when 2 s passed on a
        # loaded machine); once a write was refused it must name the cause.
        def refused_for_memory() -> bool:
            code, body = ready()
            failing = " ".join(body.get("failing", {}).values())
            return code == 503 and "Redis out of memory: refusing writes" in failing     # the cause (issue 44)
        wait_until(refused_for_memory, 60, "not ready, naming Redis out of memory, while Redis refuses writes",
                   on_timeout=lambda: f"{ready()}\n{worker.text()}")
        doc = status(cartridge, env)                           # plain reads: they work out of memory
        assert "redis" not in doc["unavailable"], doc["unavailable"]
        assert any("out of memory" in p for p in doc["problems"]), doc["problems"]
        assert not any("stopped consuming" in p for p in doc["problems"]), doc["problems"]
        node.client().config_set("maxmemory", "0")
        wait_done(cartridge, env, count_lines(events), worker)
        wait_until(lambda: ready()[0] == 200, 60, "ready again", on_timeout=worker.text)
        assert "ingestion resumed after" in worker.text()
        private_services.down("kafka")
        try:
            wait_until(lambda: "Kafka" in " ".join(ready()[1].get("failing", {}).values()), 120,
                       "not ready, naming Kafka, while Kafka is down", on_timeout=worker.text)
        finally:
            private_services.up("kafka")
        wait_until(lambda: ready()[0] == 200, 180, "ready once Kafka is back", on_timeout=worker.text)
        worker.terminate()
        judge(cartridge, env, events, 0)
    finally:
        worker.terminate()
        node.stop()
