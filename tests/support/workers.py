"""Helpers for the worker tests (no tests here): a memory store with an injected commit failure, records as a
topic would hold them, cartridge copies with unique names, and the real-services plumbing (subprocess
workers, waiting for lag 0, digests)."""
from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml

from keel.cartridge import Cartridge, load_cartridge
from keel.digest import digest
from keel.embedded import build_embedded
from keel.errors import StoreUnavailable
from keel.store.base import EventWrites, Position
from keel.store.memory import MemoryStore
from keel.wire import partition_for
from workers.publish import prepare
from workers.records import Record

ROOT = Path(__file__).resolve().parents[2]
CARTRIDGES = ("finance", "fleet", "salon")
T0_MS = 1_800_000_000_000          # a fixed LogAppendTime for records built in tests (after every sample event)


class FailingStore(MemoryStore):
    """The memory store (the batch contract included) with one injected failure: the commit step after
    `fail_after` successful ones raises StoreUnavailable."""

    def __init__(self) -> None:
        super().__init__()
        self.commits = 0
        self.fail_after: int | None = None      # raise StoreUnavailable on the commit after this many

    def commit_batch(self, tenant: str, events: Sequence[EventWrites], position: Position | None) -> None:
        if self.fail_after is not None and self.commits >= self.fail_after:
            self.fail_after = None
            raise StoreUnavailable("injected failure", tenant=tenant)
        self.commits += 1
        super().commit_batch(tenant, events, position)


def topic_records(values: Iterable[tuple[bytes | None, bytes | None]], *, topic: str = "keel.t.events",
                  partitions: int = 4, timestamp_ms: int = T0_MS) -> list[Record]:
    """(key, value) pairs laid out on partitions the way Kafka's default partitioner would, with offsets."""
    next_offset = [0] * partitions
    out = []
    for i, (key, value) in enumerate(values):
        p = partition_for(key.decode(), partitions) if key else i % partitions
        out.append(Record(topic, p, next_offset[p], timestamp_ms + i, key, value))
        next_offset[p] += 1
    return out


def by_partition_batches(records: list[Record], size: int) -> list[list[Record]]:
    """Batches as a consumer fetches them: each partition's records in order, interleaved across partitions."""
    queues: dict[int, list[Record]] = {}
    for r in records:
        queues.setdefault(r.partition, []).append(r)
    batches, batch = [], []
    while any(queues.values()):
        for p in sorted(queues):
            take = queues[p][:max(1, size // 4)]
            queues[p] = queues[p][len(take):]
            batch += take
            if len(batch) >= size:
                batches.append(batch)
                batch = []
    if batch:
        batches.append(batch)
    return batches


def sample_records(name: str, **kwargs: Any) -> list[Record]:
    """A cartridge's sample stream as `keel publish` sends it (canonical envelopes, key = tenant)."""
    cartridge = load_cartridge(ROOT / "cartridges" / name)
    return topic_records(prepare(cartridge, ROOT / "cartridges" / name / "events.jsonl").records, **kwargs)


def embedded_digests(cartridge: Cartridge, events: Path) -> dict[str, str]:
    """{tenant: digest} of the embedded build of an events file."""
    with open(os.devnull, "w") as quiet:
        projector, report = build_embedded(cartridge, events, stream=quiet)
    return {t: digest(projector.store, t) for t in sorted(report.tenants)}


def write_jsonl(path: Path, envelopes: Iterable[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in envelopes))
    return path


# ---- real services ------------------------------------------------------------------------------

def services_env() -> dict[str, str]:
    """KEEL_KAFKA_BOOTSTRAP and KEEL_REDIS_URL from the environment (skip, or fail under KEEL_REQUIRE_SERVICES)."""
    from support.services import service_env
    return {"KEEL_KAFKA_BOOTSTRAP": service_env("KEEL_KAFKA_BOOTSTRAP"),
            "KEEL_REDIS_URL": service_env("KEEL_REDIS_URL")}


def unique_cartridge(tmp_path: Path, name: str | Path = "finance", prefix: str = "t") -> Path:
    """A copy of cartridges/<name> (or of the cartridge folder `name`) under a unique cartridge name, so topics
    and Redis namespaces are fresh."""
    src = name if isinstance(name, Path) else ROOT / "cartridges" / name
    folder = tmp_path / src.name
    if folder.exists():
        folder = tmp_path / f"{src.name}-{uuid.uuid4().hex[:6]}"
    folder.mkdir(parents=True)
    for f in src.iterdir():
        if f.is_file():
            (folder / f.name).write_bytes(f.read_bytes())
    spec = yaml.safe_load((folder / "cartridge.yaml").read_text())
    unique = f"{prefix}{uuid.uuid4().hex[:10]}"
    text = (folder / "cartridge.yaml").read_text().replace(f"name: {spec['name']}", f"name: {unique}", 1)
    (folder / "cartridge.yaml").write_text(text)
    assert load_cartridge(folder).name == unique
    return folder


def keel(*args: str, env: dict[str, str], check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the keel CLI in a subprocess."""
    proc = subprocess.run([sys.executable, "-m", "keel.cli", *args], check=False, capture_output=True,
                          text=True, env={**os.environ, **env}, cwd=ROOT, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"keel {' '.join(args)} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc


class KeelProcess:
    """A `python -m <module> …` subprocess of Keel, logging to a file (workers, relays, webhooks)."""

    def __init__(self, module: str, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        self._out = open(log, "ab")  # noqa: SIM115 - open for the life of the subprocess
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], stdout=self._out,
                                     stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=ROOT)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL: no cleanup at all."""
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)
        self._out.close()

    def terminate(self, timeout: float = 60) -> int:
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"did not stop on SIGTERM within {timeout}s; log:\n{self.text()}") from None
        finally:
            self._out.close()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


class WorkerProcess(KeelProcess):
    """`keel worker` as a subprocess, logging to a file."""

    def __init__(self, cartridges: list[Path], env: dict[str, str], log: Path, *extra: str) -> None:
        super().__init__("keel.cli", ["worker", *map(str, cartridges), "--quiet", *extra], env, log)

    def text(self) -> str:
        """The end of the log: enough to see why a worker stopped."""
        return super().text()[-6000:]


def wait_until(predicate: Callable[[], bool], timeout: float, what: str, interval: float = 0.3,
               on_timeout: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}\n{on_timeout()}")


def status(cartridge: Path, env: dict[str, str]) -> dict[str, Any]:
    from keel.config import resolve
    from workers.status import gather_status
    settings = resolve({"kafka": env["KEEL_KAFKA_BOOTSTRAP"], "redis": env["KEEL_REDIS_URL"]})
    doc = gather_status(load_cartridge(cartridge), settings, per_tenant=False)
    if "kafka" in doc["unavailable"]:       # callers wait through an outage by catching this
        from keel.errors import KafkaUnavailable
        raise KafkaUnavailable(doc["unavailable"]["kafka"])
    return doc


def _group_parts(cartridge: Path, env: dict[str, str]) -> list[Any] | None:
    """The worker group's partitions (end, committed, lag) from Kafka only: the group's offsets, what `status`
    computes its lag from, for a fifth of its CPU; None while Kafka or the group's coordinator is not there
    yet (e.g. a broker restarting)."""
    from keel.errors import KafkaUnavailable
    from keel.kafka import group_offsets
    from keel.wire import events_topic, group_id
    name = load_cartridge(cartridge).name
    try:
        return list(asyncio.run(group_offsets(env["KEEL_KAFKA_BOOTSTRAP"], events_topic(name), group_id(name))))
    except KafkaUnavailable:
        return None


def _still_running(worker: WorkerProcess | None) -> None:
    if worker is not None and not worker.alive():
        raise AssertionError(f"worker exited with {worker.proc.returncode}:\n{worker.text()}")


def committed(cartridge: Path, env: dict[str, str]) -> int:
    """Offsets the worker group committed so far, from Kafka only (`status` reads more, too slowly to catch a
    worker in the middle of a small backlog); 0 while the group's coordinator is not known yet."""
    parts = _group_parts(cartridge, env)
    return 0 if parts is None else sum(p.committed or 0 for p in parts)


def wait_committed(cartridge: Path, env: dict[str, str], expected: int, worker: WorkerProcess | None,
                   timeout: float) -> float:
    """Wait until Kafka alone says lag 0 over at least `expected` records: the group's offsets, what `status`
    computes its lag from, read for a fifth of `status`'s CPU. A wait for lag 0 waits for this first and then asks
    `status` (which reads Redis and the group's members too). Returns the seconds left of `timeout`."""
    deadline = time.monotonic() + timeout

    def caught_up() -> bool:
        _still_running(worker)
        parts = _group_parts(cartridge, env)
        return parts is not None and sum(p.end for p in parts) >= expected and sum(p.lag for p in parts) == 0
    wait_until(caught_up, timeout, f"lag 0 over {expected} records (the group's offsets)",
               on_timeout=lambda: worker.text() if worker is not None else "")
    return max(deadline - time.monotonic(), 1.0)


def wait_applied(cartridge: Path, env: dict[str, str], expected: int, worker: WorkerProcess | None = None,
                 timeout: float = 180) -> None:
    """Wait until the worker group committed every one of `expected` records (lag 0)."""
    from keel.errors import KafkaUnavailable

    def done() -> bool:
        try:
            doc = status(cartridge, env)
        except KafkaUnavailable:        # e.g. a fresh broker whose group coordinator is not elected yet
            return False
        ends = sum(p["end"] for p in doc["partitions"])
        _still_running(worker)
        return ends >= expected and doc["lag"] == 0
    left = wait_committed(cartridge, env, expected, worker, timeout)
    wait_until(done, left, f"lag 0 over {expected} records",
               on_timeout=lambda: worker.text() if worker is not None else "")


def redis_digests(cartridge: Path, env: dict[str, str], tenants: Iterable[str]) -> dict[str, str]:
    from keel.store.redis import RedisStore
    store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=load_cartridge(cartridge).name)
    try:
        return {t: digest(store, t) for t in sorted(tenants)}
    finally:
        store.close()


def produce_raw(env: dict[str, str], topic: str, records: list[tuple[bytes | None, bytes | None]],
                partitions: int = 8) -> None:
    """Produce records exactly as given (bytes a product could send), creating the topic like Keel does."""
    from keel.kafka import TopicSpec, ensure_topics
    from workers.publish import send_records

    async def go() -> None:
        await ensure_topics(env["KEEL_KAFKA_BOOTSTRAP"], [topic], TopicSpec(partitions))
        await send_records(env["KEEL_KAFKA_BOOTSTRAP"], topic, records)  # type: ignore[arg-type]
    asyncio.run(go())


def read_until(bootstrap: str, topic: str, *, until: Callable[[list[Any]], bool], timeout: float = 60) -> list[Any]:
    """Records of a topic from the beginning, until `until(records)` holds or the timeout passes."""
    from aiokafka import AIOKafkaConsumer

    async def go() -> list[Any]:
        consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=None,
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        out: list[Any] = []
        try:
            deadline = time.monotonic() + timeout
            while not until(out) and time.monotonic() < deadline:
                for recs in (await consumer.getmany(timeout_ms=300)).values():
                    out += recs
        finally:
            await consumer.stop()
        return out
    return asyncio.run(go())


def read_topic(env: dict[str, str], topic: str, expected: int, timeout: float = 60) -> list[Any]:
    """Every record of a topic (from the beginning), waiting until at least `expected` are there."""
    return read_until(env["KEEL_KAFKA_BOOTSTRAP"], topic, until=lambda out: len(out) >= expected, timeout=timeout)


services = pytest.mark.services
