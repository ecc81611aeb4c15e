"""Issue 22: `redis+sentinel://` URLs. The primary is killed -9 under load; Redis Sentinel promotes the replica and
the running worker follows it without a restart (whatever the replica had not received is re-applied from the
log); digests equal the embedded build."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.redis_nodes import RedisNode, SentinelNode
from support.replay import BackgroundPublisher, count_lines, finance_file, split_file
from support.workers import WorkerProcess, keel, unique_cartridge, wait_until

from .conftest import PrivateServices
from .test_failover import wait_repaired
from .test_faults import judge, wait_working

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]
TENANTS = {f"hogar-{i:02d}": 250 for i in range(12)}


def test_sentinel_failover_under_load_is_followed_without_a_restart(tmp_path: Path,
                                                                     private_services: PrivateServices) -> None:
    primary = RedisNode(tmp_path / "primary").start()
    replica = RedisNode(tmp_path / "replica", replica_of=primary).start()
    sentinel = SentinelNode(tmp_path / "sentinel", primary).start()
    env = {**private_services.env, "KEEL_REDIS_URL": sentinel.url()}
    cartridge = unique_cartridge(tmp_path, "finance")
    events = finance_file(tmp_path / "events.jsonl", TENANTS)
    publisher = BackgroundPublisher(cartridge, split_file(events, 6), env, pause_s=0.7)
    worker = WorkerProcess([cartridge], env, tmp_path / "worker.log", "--batch", "300")
    try:
        publisher.start()
        wait_working(cartridge, env, worker)
        primary.kill()                                   # under load: Sentinel must promote the replica
        wait_until(lambda: sentinel.primary_port() == replica.port, 60, "Sentinel promoting the replica")
        publisher.join(120)
        assert publisher.error is None, publisher.error
        wait_repaired(cartridge, env, count_lines(events), worker)
        assert worker.alive(), worker.text()
        status = keel("status", str(cartridge), "--json", env=env, check=False)
        assert status.returncode == 0, status.stdout + status.stderr
        worker.terminate()
        judge(cartridge, env, events, 0)
    finally:
        worker.terminate()
        sentinel.stop()
        primary.stop()
        replica.stop()

