"""Issue 44: with Redis out of memory a worker's /readyz turned 503 only after --unready-after (30 s by default: a
20 s squeeze never showed), naming "tenant_starts failed: OutOfMemoryError: Command # 1 (GET …) of pipeline caused
error". It must turn at once, saying "Redis out of memory: refusing writes", and be ready again once Redis
takes writes. --unready-after is an hour here: only the immediate signal can make it unready."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from support.mcp_sessions import free_port
from support.probes import get
from support.redis_nodes import RedisNode
from support.replay import count_lines, finance_file, split_file
from support.workers import WorkerProcess, keel, unique_cartridge, wait_until

from .conftest import PrivateServices
from .test_faults import judge, wait_done

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]
REFUSING = "Redis out of memory: refusing writes"


def test_readiness_says_redis_refuses_writes_at_once(tmp_path: Path, private_services: PrivateServices) -> None:
    node = RedisNode(tmp_path / "redis").start()
    env = {**private_services.env, "KEEL_REDIS_URL": node.url}
    cartridge = unique_cartridge(tmp_path, "finance")
    events = finance_file(tmp_path / "events.jsonl", {"hogar-a": 300, "hogar-b": 300})
    first, second = split_file(events, 2)
    port = free_port()
    worker = WorkerProcess([cartridge], env, tmp_path / "worker.log", "--metrics-port", str(port),
                           "--unready-after", "3600")

    def ready() -> tuple[int, dict]:
        code, body = get(f"http://127.0.0.1:{port}/readyz")
        return code, json.loads(body)
    try:
        keel("publish", str(cartridge), str(first), "--quiet", env=env)
        wait_done(cartridge, env, count_lines(first), worker)
        wait_until(lambda: ready()[0] == 200, 60, "ready", on_timeout=worker.text)
        node.client().config_set("maxmemory", "1")             # every write refused from now on
        keel("publish", str(cartridge), str(second), "--quiet", env=env)
        wait_until(lambda: REFUSING in ready()[1].get("failing", {}).values(), 60,
                   f"/readyz 503 saying {REFUSING!r}", on_timeout=lambda: f"{ready()}\n{worker.text()}")
        code, doc = ready()
        assert code == 503 and list(doc["failing"].values()) == [REFUSING], doc          # that, and only that
        node.client().config_set("maxmemory", "0")
        wait_done(cartridge, env, count_lines(events), worker)
        wait_until(lambda: ready()[0] == 200, 60, "ready again", on_timeout=worker.text)
        text = worker.text()
        assert "ingestion resumed after" in text
        assert "Command #" not in text, text                   # the cause, not the queued GET that met it
        # one WARNING for the outage, not one per try (reminders only every 30 s)
        assert text.count("failing, retrying until it works: a batch of") == 1, text
        worker.terminate()
        judge(cartridge, env, events, 0)
    finally:
        worker.terminate()
        node.stop()
