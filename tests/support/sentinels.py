"""Redis as docs/operations.md ("Redis high availability") recommends it, from local processes: a primary and a
replica (support/redis_nodes.RedisNode, each with noeviction and min-replicas-to-write 1 / min-replicas-max-lag
10 on its command line) under three Sentinels with quorum 2, `down-after-milliseconds 2500` and
`failover-timeout 6000`. `redis+sentinel://` URL of all three; the current primary asked of them."""
from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

import redis

from .redis_nodes import RedisNode, free_port

NODE_FLAGS = ("--maxmemory-policy", "noeviction", "--min-replicas-to-write", "1", "--min-replicas-max-lag", "10")
SERVICE = "keel"


class Sentinel:
    """One Sentinel of three (quorum 2)."""

    def __init__(self, folder: Path, primary: RedisNode) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.primary = primary
        self.proc: subprocess.Popen | None = None

    def start(self) -> Sentinel:
        conf = self.folder / "sentinel.conf"
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {self.folder}\n"
                        f"sentinel monitor {SERVICE} 127.0.0.1 {self.primary.port} 2\n"
                        f"sentinel down-after-milliseconds {SERVICE} 2500\n"
                        f"sentinel failover-timeout {SERVICE} 6000\n"
                        f"sentinel parallel-syncs {SERVICE} 1\n")
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        with open(self.folder / "sentinel.log", "ab") as log:
            self.proc = subprocess.Popen([binary, str(conf), "--sentinel"], stdout=log, stderr=subprocess.STDOUT)
        return self

    def primary_port(self) -> int | None:
        try:
            answer = redis.Redis(port=self.port, socket_timeout=2).execute_command(
                "SENTINEL", "GET-MASTER-ADDR-BY-NAME", SERVICE)
        except redis.RedisError:
            return None
        return None if not answer else int(answer[1])

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class RedisHA:
    """A primary, a replica and three Sentinels; `failed_over_to(node)` waits for the Sentinels to agree."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.primary = RedisNode(folder / "node-a")
        self.replica = RedisNode(folder / "node-b", replica_of=self.primary)
        self.sentinels = [Sentinel(folder / f"sentinel-{i}", self.primary) for i in range(3)]

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self) -> RedisHA:
        self.primary.start(*NODE_FLAGS)
        self.replica.start(*NODE_FLAGS)
        self.primary.wait_in_sync(self.replica)
        for s in self.sentinels:
            s.start()
        self.wait_primary(self.primary)
        deadline = time.monotonic() + 30           # each Sentinel knows the replica and the others
        while time.monotonic() < deadline:
            try:
                infos = [redis.Redis(port=s.port, socket_timeout=2).sentinel_master(SERVICE) for s in self.sentinels]
            except redis.RedisError:
                infos = []
            if infos and all(int(i["num-slaves"]) >= 1 and int(i["num-other-sentinels"]) >= 2 for i in infos):
                return self
            time.sleep(0.2)
        raise AssertionError("the Sentinels did not discover the replica and each other in 30 s")

    def set_all(self, option: str, value: str) -> None:
        """SENTINEL SET on every Sentinel (each keeps its own copy of a monitored primary's settings)."""
        for s in self.sentinels:
            redis.Redis(port=s.port, socket_timeout=5).execute_command("SENTINEL", "SET", SERVICE, option, value)

    def primary_ports(self) -> list[int | None]:
        return [s.primary_port() for s in self.sentinels]

    def wait_primary(self, node: RedisNode, timeout: float = 90) -> None:
        """Until every Sentinel names `node` as the primary."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(p == node.port for p in self.primary_ports()):
                return
            time.sleep(0.2)
        logs = "\n".join((s.folder / "sentinel.log").read_text(errors="replace")[-2000:] for s in self.sentinels)
        raise AssertionError(f"the Sentinels did not agree on {node.port} within {timeout}s: {self.primary_ports()}\n"
                             f"{logs}")

    def rejoin(self, old: RedisNode, primary: RedisNode) -> RedisNode:
        """Start a killed node again, on its port, as a replica of `primary` (what its restart under Sentinel
        ends as; started as one directly so it never takes writes as a second primary)."""
        node = RedisNode(old.folder, replica_of=primary, port=old.port)
        node.start(*NODE_FLAGS)
        return node

    def stop(self) -> None:
        for s in self.sentinels:
            s.stop()
        self.primary.stop()
        self.replica.stop()
