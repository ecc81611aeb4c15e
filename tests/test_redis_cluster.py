"""The store contract and the Redis checks against a local 3-master Redis Cluster.

Uses the cluster at KEEL_REDIS_CLUSTER_URL when set; otherwise starts one with
`deploy/local/redis-cluster up` on free ports (from KEEL_TEST_REDIS_CLUSTER_PORT, default 7100, plus 100 per
pytest-xdist worker) in a temporary folder, and tears it down (`down --clean`) after the session. Skips when
redis-server is missing, unless KEEL_REQUIRE_SERVICES=1.
"""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from support.admin_contract import StoreAdminContract
from support.batch_contract import BatchWritesContract
from support.reads_contract import StoreReadsContract
from support.redis_checks import RedisChecks, d

from keel import reading
from keel.store.base import Store, ViewRequest
from keel.store.redis import RedisStore

pytestmark = pytest.mark.services

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "deploy" / "local" / "redis-cluster"


def _unavailable(reason: str) -> None:
    if os.environ.get("KEEL_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} but KEEL_REQUIRE_SERVICES=1")
    pytest.skip(reason)


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def _run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=240, check=False)


@pytest.fixture(scope="session")
def redis_cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    given = os.environ.get("KEEL_REDIS_CLUSTER_URL")
    if given:
        yield given
        return
    if not SCRIPT.is_file():
        _unavailable(f"{SCRIPT} is missing")
    if not shutil.which("redis-server") and os.geteuid() != 0:
        _unavailable("redis-server is not installed")
    # each pytest-xdist worker scans its own 100 ports, so that two workers never pick the same free ones at once
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    first = int(os.environ.get("KEEL_TEST_REDIS_CLUSTER_PORT", "7100")) + 100 * worker
    base = next((p for p in range(first, first + 100, 10) if all(_port_free(p + i) for i in range(3))), None)
    if base is None:
        _unavailable(f"no 3 free ports from {first}")
    env = {**os.environ, "KEEL_LOCAL_REDIS_CLUSTER_PORT": str(base),
           "KEEL_LOCAL_REDIS_CLUSTER_DIR": str(tmp_path_factory.mktemp("redis-cluster"))}
    up = _run(["up"], env)
    try:
        url = next((line.split("=", 1)[1] for line in up.stdout.splitlines()
                    if line.startswith("KEEL_REDIS_CLUSTER_URL=")), None)
        if up.returncode != 0 or url is None:
            _unavailable(f"deploy/local/redis-cluster up failed (exit {up.returncode}): {up.stderr[-2000:]}")
        yield url
    finally:
        _run(["down", "--clean"], env)


@pytest.fixture(scope="class")
def cluster_node(request: pytest.FixtureRequest, redis_cluster_url: str) -> Iterator[None]:
    probe = RedisStore.from_url(redis_cluster_url, namespace=f"probe{uuid.uuid4().hex[:12]}")  # cluster auto-detected
    request.cls.url = redis_cluster_url
    request.cls.client = probe.client
    request.cls.cluster = True
    yield
    probe.drop_namespace()
    probe.close()


class _RollingRedisStore(RedisStore):
    roll_bytes = 1          # every step closes the segments it wrote: restatements and ROLL on every slot


@pytest.mark.usefixtures("cluster_node")
class TestRedisClusterStore(RedisChecks, StoreReadsContract, BatchWritesContract, StoreAdminContract):
    """The contract suites and the Redis checks on a 3-master Cluster, a segment closed after every step (so
    ROLL's RENAME, the valid-time index and the reads of subjects' and closed segments, keys built in the
    scripts, run on every node)."""
    store_class = _RollingRedisStore

    def make_store(self) -> Store:
        return self.redis_store()

    def make_batch_store(self) -> Store:
        return self.redis_store()

    def test_from_url_detects_the_cluster(self) -> None:
        assert isinstance(self.client, RedisCluster)
        explicit = RedisStore.from_url(self.url, namespace=f"probe{uuid.uuid4().hex[:12]}", cluster=True)
        try:
            assert isinstance(explicit.client, RedisCluster)
        finally:
            explicit.drop_namespace()
            explicit.close()

    def test_tenants_spread_over_the_masters(self) -> None:
        s = self.redis_store()
        tenants = [f"tenant-{i}" for i in range(24)]
        for t in tenants:
            s.open_fact(t, "thing:x", "p", t, valid_from=d(1), evidence="e1")
            s.commit_batch(t, [([], "e2")], ("topic", 0, 5))
        nodes = {self.client.get_node_from_key(s.key_names(t)[0]).name for t in tenants}
        assert len(nodes) == 3
        assert s.tenants() == sorted(tenants)
        for t in tenants:
            assert reading.facts(s, t, "thing:x", at=d(2))[0]["value"] == t
            assert s.applied_offset(t, "topic", 0) == 5

    def test_commit_many_reloads_scripts_flushed_from_the_nodes(self) -> None:
        s = self.redis_store()
        s.commit_many([(f"tenant-{i}", [([], f"e{i}")], ("topic", 0, i)) for i in range(12)])
        self.client.execute_command("SCRIPT FLUSH", target_nodes=RedisCluster.PRIMARIES)
        s.commit_many([(f"tenant-{i}", [([], f"f{i}")], ("topic", 0, 20 + i)) for i in range(12)])
        assert [s.applied_offset(f"tenant-{i}", "topic", 0) for i in range(12)] == [20 + i for i in range(12)]
        assert s.event_ids("tenant-3") == ["e3", "f3"]
        for i in range(12):
            s.open_fact(f"tenant-{i}", "thing:x", "p", i, valid_from=d(1))
        self.client.execute_command("SCRIPT FLUSH", target_nodes=RedisCluster.PRIMARIES)
        views = reading.views(s, [ViewRequest(f"tenant-{i}", "thing:x") for i in range(12)], at=d(2))
        assert [v.facts[0]["value"] for v in views if v] == list(range(12))
