"""redis-server processes a fault test owns: a primary and its replicas on free ports, each its own folder, so
a test can pause one (SIGSTOP), kill one (-9), promote a replica or restart one from an older RDB file."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisNode:
    """One redis-server (no AOF; RDB only when saved explicitly)."""

    def __init__(self, folder: Path, *, replica_of: RedisNode | None = None, port: int | None = None) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = port or free_port()
        self.replica_of = replica_of
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, *extra: str) -> RedisNode:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        args = [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--dir", str(self.folder), "--save", "",
                "--appendonly", "no", "--dbfilename", "dump.rdb", *extra]
        if self.replica_of is not None:
            args += ["--replicaof", "127.0.0.1", str(self.replica_of.port)]
        with open(self.folder / "redis.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if self.client().ping():
                    return self
            except redis.RedisError:
                time.sleep(0.1)
        raise AssertionError(f"redis-server on {self.port} did not start:\n{(self.folder / 'redis.log').read_text()}")

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=10, decode_responses=True)

    def wait_in_sync(self, replica: RedisNode, timeout: float = 30) -> None:
        """Until `replica` acknowledged everything this primary holds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.client().execute_command("WAIT", 1, 1000) >= 1:
                return
        raise AssertionError("the replica did not catch up")

    def pause(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def promote(self) -> None:
        self.client().execute_command("REPLICAOF", "NO", "ONE")
        self.replica_of = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()


class SentinelNode:
    """One redis-sentinel watching `primary` as service `name` (quorum 1, a failover after 1 s down)."""

    def __init__(self, folder: Path, primary: RedisNode, name: str = "keel") -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.name = name
        self.primary = primary
        self.proc: subprocess.Popen | None = None

    def url(self, db: int = 0) -> str:
        return f"redis+sentinel://127.0.0.1:{self.port}/{self.name}/{db}"

    def start(self) -> SentinelNode:
        conf = self.folder / "sentinel.conf"
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\ndir {self.folder}\n"
                        f"sentinel monitor {self.name} 127.0.0.1 {self.primary.port} 1\n"
                        f"sentinel down-after-milliseconds {self.name} 1000\n"
                        f"sentinel failover-timeout {self.name} 10000\n")
        binary = shutil.which("redis-sentinel") or shutil.which("redis-server") or "/usr/bin/redis-server"
        args = [binary, str(conf)] + ([] if binary.endswith("redis-sentinel") else ["--sentinel"])
        with open(self.folder / "sentinel.log", "ab") as log:
            self.proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                if self.primary_port() == self.primary.port:
                    return self
            except redis.RedisError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"redis-sentinel did not start:\n{(self.folder / 'sentinel.log').read_text()}")

    def primary_port(self) -> int:
        _host, port = redis.Redis(port=self.port, socket_timeout=5).execute_command(
            "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.name)
        return int(port)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
