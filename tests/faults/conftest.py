"""Private Kafka and Redis for the fault tests (started once for the tier with deploy/local/services on free
ports and their own data folder, so they can be stopped and restarted; never the shared services)."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "deploy" / "local" / "services"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PrivateServices:
    """Kafka + Redis of this session; `restart(name)` stops and starts one, keeping its data."""
    folder: Path
    kafka_port: int
    controller_port: int
    redis_port: int

    @property
    def env(self) -> dict[str, str]:
        return {"KEEL_KAFKA_BOOTSTRAP": f"127.0.0.1:{self.kafka_port}",
                "KEEL_REDIS_URL": f"redis://127.0.0.1:{self.redis_port}/0"}

    def _run(self, command: str, services: str) -> str:
        env = {**os.environ, "KEEL_LOCAL_SERVICES": services, "KEEL_LOCAL_DIR": str(self.folder),
               "KEEL_LOCAL_KAFKA_PORT": str(self.kafka_port),
               "KEEL_LOCAL_KAFKA_CONTROLLER_PORT": str(self.controller_port),
               "KEEL_LOCAL_REDIS_PORT": str(self.redis_port)}
        for name in ("KEEL_KAFKA_BOOTSTRAP", "KEEL_REDIS_URL"):
            env.pop(name, None)
        proc = subprocess.run([str(SERVICES), command], env=env, capture_output=True, text=True, timeout=300,
                              check=False)
        if proc.returncode != 0:
            raise AssertionError(f"services {command} {services} failed:\n{proc.stderr[-3000:]}")
        return proc.stdout

    def up(self, services: str = "kafka redis") -> None:
        self._run("up", services)

    def down(self, services: str = "kafka redis") -> None:
        self._run("down", services)

    def restart(self, service: str) -> None:
        self.down(service)
        self.up(service)


@pytest.fixture(scope="package")     # stopped after the tier's last test, not at the end of the worker's session
def private_services() -> Iterator[PrivateServices]:
    if not shutil.which("java") and not os.environ.get("KEEL_REQUIRE_SERVICES"):
        pytest.skip("the fault suite starts its own Kafka: needs Java (run through `make test`)")
    folder = Path(tempfile.mkdtemp(prefix="keel-faults-"))
    services = PrivateServices(folder, _free_port(), _free_port(), _free_port())
    services.up()
    try:
        yield services
    finally:
        try:
            services.down()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
