"""Faults under load, on private services: a worker killed -9 repeatedly, Redis restarted, the Kafka broker
restarted, a poison event. Every case is judged by digest equality with the embedded build of the same events
and by the dead-letter count."""
from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from support.replay import BackgroundPublisher, count_lines, finance_file, split_file
from support.twins import python_twin
from support.workers import (
    WorkerProcess,
    embedded_digests,
    keel,
    read_topic,
    redis_digests,
    status,
    unique_cartridge,
    wait_committed,
    wait_until,
)

from keel.cartridge import load_cartridge
from keel.kafka import KafkaUnavailable

from .conftest import PrivateServices

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]
TENANTS = {"hogar-a": 2500, "hogar-b": 2000, "hogar-c": 1500}


def wait_done(cartridge: Path, env: dict[str, str], expected: int, worker: WorkerProcess | None,
              timeout: float = 240) -> dict:
    """Lag 0 over `expected` records, tolerating Kafka answering errors while it (re)starts."""
    doc: dict = {}

    def done() -> bool:
        nonlocal doc
        if worker is not None and not worker.alive():
            raise AssertionError(f"worker exited with {worker.proc.returncode}:\n{worker.text()}")
        try:
            doc = status(cartridge, env)
        except KafkaUnavailable:
            return False
        return sum(p["end"] for p in doc["partitions"]) >= expected and doc["lag"] == 0
    timeout = wait_committed(cartridge, env, expected, worker, timeout)
    wait_until(done, timeout, f"lag 0 over {expected} records", interval=0.5,
               on_timeout=lambda: worker.text() if worker is not None else "")
    return doc


def wait_working(cartridge: Path, env: dict[str, str], worker: WorkerProcess) -> None:
    """Until the worker has committed a first batch: past its start-up checks, which fail fast by design
    when a service is down, so a restart before this point would test the preflight, not the recovery."""
    def committed() -> bool:
        if not worker.alive():
            raise AssertionError(f"worker exited with {worker.proc.returncode}:\n{worker.text()}")
        try:
            return any(p["committed"] is not None for p in status(cartridge, env)["partitions"])
        except KafkaUnavailable:
            return False
    wait_until(committed, 120, "the worker's first committed batch", interval=0.3, on_timeout=worker.text)


def judge(cartridge: Path, env: dict[str, str], events: Path, dead_letters: int) -> None:
    expected = embedded_digests(load_cartridge(cartridge), events)
    assert redis_digests(cartridge, env, expected) == expected
    assert status(cartridge, env)["dead_letters"]["total"] == dead_letters


def test_worker_killed_at_random_points_under_load(tmp_path: Path, private_services: PrivateServices) -> None:
    env = private_services.env
    cartridge = unique_cartridge(tmp_path, "finance")
    events = finance_file(tmp_path / "events.jsonl", TENANTS)
    publisher = BackgroundPublisher(cartridge, split_file(events, 8), env, pause_s=0.5)
    publisher.start()
    rng = random.Random(5)
    for i in range(5):
        worker = WorkerProcess([cartridge], env, tmp_path / f"worker{i}.log", "--batch", "300")
        time.sleep(rng.uniform(1.5, 4.0))
        assert worker.alive(), worker.text()
        worker.kill()
    publisher.join(120)
    assert publisher.error is None, publisher.error
    worker = WorkerProcess([cartridge], env, tmp_path / "worker-last.log")
    try:
        wait_done(cartridge, env, count_lines(events), worker)
    finally:
        worker.terminate()
    judge(cartridge, env, events, 0)


def test_redis_restarted_mid_stream(tmp_path: Path, private_services: PrivateServices) -> None:
    env = private_services.env
    cartridge = unique_cartridge(tmp_path, "finance")
    events = finance_file(tmp_path / "events.jsonl", TENANTS)
    publisher = BackgroundPublisher(cartridge, split_file(events, 6), env, pause_s=0.5)
    worker = WorkerProcess([cartridge], env, tmp_path / "worker.log", "--batch", "300")
    try:
        publisher.start()
        wait_working(cartridge, env, worker)
        private_services.restart("redis")
        publisher.join(120)
        assert publisher.error is None, publisher.error
        wait_done(cartridge, env, count_lines(events), worker)
        assert worker.alive(), worker.text()
    finally:
        worker.terminate()
    judge(cartridge, env, events, 0)


def test_kafka_broker_restarted_mid_stream(tmp_path: Path, private_services: PrivateServices) -> None:
    env = private_services.env
    cartridge = unique_cartridge(tmp_path, "finance")
    events = finance_file(tmp_path / "events.jsonl", TENANTS)
    first, second = split_file(events, 2)
    keel("publish", str(cartridge), str(first), "--quiet", env=env)
    worker = WorkerProcess([cartridge], env, tmp_path / "worker.log", "--batch", "200")
    try:
        wait_working(cartridge, env, worker)
        private_services.restart("kafka")
        keel("publish", str(cartridge), str(second), "--quiet", env=env)
        wait_done(cartridge, env, count_lines(events), worker)
    finally:
        worker.terminate()
    judge(cartridge, env, events, 0)


POISON = '''
    if p["creditor"] == "POISON":
        raise ValueError("poisoned snapshot")
'''


def test_poison_event_is_dead_lettered_once_and_the_rest_applied(tmp_path: Path,
                                                                private_services: PrivateServices) -> None:
    env = private_services.env
    cartridge = python_twin(unique_cartridge(tmp_path, "finance"), tmp_path, "finance")  # its handlers in Python
    handlers = cartridge / "handlers.py"
    anchor = '    p = event.payload\n    store.upsert_entity(event.tenant, "debt"'
    text = handlers.read_text()
    assert anchor in text
    handlers.write_text(text.replace(anchor, '    p = event.payload' + POISON + anchor.split("\n", 1)[1], 1))
    fixed = _poisoned(finance_file(tmp_path / "events.jsonl", TENANTS))
    keel("publish", str(cartridge), str(fixed), "--quiet", env=env)
    worker = WorkerProcess([cartridge], env, tmp_path / "worker.log", "--batch", "300")
    try:
        time.sleep(1.0)
        worker.kill()                                 # redelivery after a crash must not count it twice
        worker = WorkerProcess([cartridge], env, tmp_path / "worker2.log")
        wait_done(cartridge, env, count_lines(fixed), worker)
    finally:
        worker.terminate()
    judge(cartridge, env, fixed, 1)
    letters = read_topic(env, f"keel.{load_cartridge(cartridge).name}.dlq", 1)
    assert letters and all(b"poisoned snapshot" in dict(r.headers)["keel.reason"] for r in letters)


def _poisoned(path: Path) -> Path:
    """The file with one debt snapshot of its second half made poisonous (creditor POISON)."""
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    i = next(i for i, e in enumerate(lines) if e["type"] == "debt.snapshot" and i > len(lines) // 2)
    lines[i]["payload"]["creditor"] = "POISON"
    path.write_text("".join(json.dumps(e) + "\n" for e in lines))
    return path
