"""A three-broker KRaft Kafka on loopback that a test owns (the chaos tier): each broker also a controller, with
its own node.id, ports and log.dirs and one shared controller.quorum.voters, replication factor 3 and
min.insync.replicas=2 as docs/operations.md ("Kafka durability") recommends. Jars from deploy/local/services
(`kafka-jars`: Maven Central, fetched once into .cache/). A broker can be killed (-9), paused and started again
on its data, so it leaves the ISR and rejoins it."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVICES = ROOT / "deploy" / "local" / "services"
LOG4J = """status = warn
appender.out.type = Console
appender.out.name = out
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.out.ref = out
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kafka_libs() -> Path:
    """The folder of Kafka's jars (deploy/local/services kafka-jars fetches them once)."""
    done = subprocess.run([str(SERVICES), "kafka-jars"], capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0:
        raise AssertionError(f"deploy/local/services kafka-jars failed:\n{done.stderr[-3000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


def brokers_seen(bootstrap: str) -> int:
    """How many brokers a metadata answer from `bootstrap` lists (0 when it does not answer)."""
    from aiokafka.client import AIOKafkaClient
    from aiokafka.errors import KafkaError

    async def ask() -> int:
        client = AIOKafkaClient(bootstrap_servers=bootstrap, request_timeout_ms=3000)
        try:
            await client.bootstrap()
            return len(client.cluster.brokers())
        finally:
            await client.close()
    try:
        return asyncio.run(asyncio.wait_for(ask(), 10))
    except (KafkaError, OSError, TimeoutError):
        return 0


def in_sync(bootstrap: str, topic: str) -> dict[int, list[int]]:
    """{partition: its in-sync replicas (broker ids)} of `topic`."""
    from aiokafka.admin import AIOKafkaAdminClient

    async def ask() -> dict[int, list[int]]:
        admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=5000)
        await admin.start()
        try:
            [doc] = await admin.describe_topics([topic])
            return {p["partition"]: sorted(p["isr"]) for p in doc["partitions"]}
        finally:
            await admin.close()
    return asyncio.run(asyncio.wait_for(ask(), 30))


class KafkaCluster:
    """Three brokers (node ids 1..n) under `folder`; `bootstrap` lists them all."""

    def __init__(self, folder: Path, brokers: int = 3, heap: str = "320m") -> None:
        self.folder = folder
        self.n = brokers
        self.heap = heap
        self.ports = [_free_port() for _ in range(brokers)]
        self.controller_ports = [_free_port() for _ in range(brokers)]
        self.procs: dict[int, subprocess.Popen] = {}
        self.libs = kafka_libs()
        self.cluster_id = "A" + uuid.uuid4().hex[:21]        # 22 characters, never a leading '-'

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{p}" for p in self.ports)

    def _dir(self, i: int) -> Path:
        return self.folder / f"broker-{i + 1}"

    def _props(self, i: int) -> Path:
        voters = ",".join(f"{j + 1}@127.0.0.1:{p}" for j, p in enumerate(self.controller_ports))
        d = self._dir(i)
        (d / "data").mkdir(parents=True, exist_ok=True)
        props = d / "server.properties"
        props.write_text(f"""process.roles=broker,controller
node.id={i + 1}
controller.quorum.voters={voters}
listeners=PLAINTEXT://127.0.0.1:{self.ports[i]},CONTROLLER://127.0.0.1:{self.controller_ports[i]}
advertised.listeners=PLAINTEXT://127.0.0.1:{self.ports[i]}
controller.listener.names=CONTROLLER
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT
log.dirs={d / 'data'}
num.network.threads=2
num.io.threads=2
num.partitions=8
auto.create.topics.enable=false
log.message.timestamp.type=LogAppendTime
default.replication.factor=3
min.insync.replicas=2
unclean.leader.election.enable=false
offsets.topic.replication.factor=3
offsets.topic.num.partitions=4
transaction.state.log.replication.factor=3
transaction.state.log.min.isr=2
transaction.state.log.num.partitions=4
share.coordinator.state.topic.replication.factor=3
share.coordinator.state.topic.min.isr=2
group.initial.rebalance.delay.ms=0
replica.lag.time.max.ms=10000
""")
        (d / "log4j2.properties").write_text(LOG4J)
        return props

    def _java(self, i: int, *args: str) -> list[str]:
        return ["java", f"-Xmx{self.heap}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1", "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self._dir(i) / 'log4j2.properties'}", "-cp", f"{self.libs}/*", *args]

    def start(self) -> KafkaCluster:
        for i in range(self.n):
            props = self._props(i)
            done = subprocess.run(self._java(i, "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c",
                                             str(props), "--ignore-formatted"),
                                  capture_output=True, text=True, timeout=180, check=False)
            if done.returncode != 0:
                raise AssertionError(f"kafka storage format of broker {i + 1} failed:\n{done.stdout}{done.stderr}")
        for i in range(self.n):
            self.start_broker(i, wait=False)
        self.wait_ready()
        return self

    def start_broker(self, i: int, *, wait: bool = True) -> None:
        log = open(self._dir(i) / "kafka.log", "ab")  # noqa: SIM115 - open for the life of the broker
        self.procs[i] = subprocess.Popen(self._java(i, "kafka.Kafka", str(self._dir(i) / "server.properties")),
                                         stdout=log, stderr=subprocess.STDOUT, cwd=self._dir(i))
        log.close()
        if wait:
            self.wait_ready([i])

    def wait_ready(self, brokers: list[int] | None = None, timeout: float = 240) -> None:
        """Until each broker answers a metadata request that lists every broker (the quorum elected)."""
        deadline = time.monotonic() + timeout
        for i in brokers if brokers is not None else range(self.n):
            while True:
                proc = self.procs[i]
                if proc.poll() is not None:
                    raise AssertionError(f"broker {i + 1} exited {proc.returncode}:\n{self.log(i)[-3000:]}")
                if brokers_seen(f"127.0.0.1:{self.ports[i]}") >= self.n:
                    break
                if time.monotonic() > deadline:
                    raise AssertionError(f"broker {i + 1} not ready in {timeout}s:\n{self.log(i)[-3000:]}")
                time.sleep(0.5)

    def log(self, i: int) -> str:
        path = self._dir(i) / "kafka.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def kill(self, i: int) -> None:
        """-9: the broker leaves the ISR of every partition it replicated."""
        proc = self.procs.get(i)
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(30)

    def pause(self, i: int) -> None:
        os.kill(self.procs[i].pid, signal.SIGSTOP)

    def resume(self, i: int) -> None:
        os.kill(self.procs[i].pid, signal.SIGCONT)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                try:
                    os.kill(proc.pid, signal.SIGCONT)
                except ProcessLookupError:
                    continue
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
