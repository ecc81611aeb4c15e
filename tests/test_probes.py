"""/healthz, /readyz and /metrics of every long-running process, and the one log format (keel.logs):
units first, then `keel worker`, `keel outbox relay` and `keel webhook` with real services."""
from __future__ import annotations

import io
import json
import logging
import urllib.request
from pathlib import Path
from typing import Any

import psycopg
import pytest
from prometheus_client import CollectorRegistry, Counter
from support.mcp_sessions import free_port
from support.outbox import (
    Background,
    fresh_schema,
    ingress_env,
    insert_all,
    relay_caught_up,
    relay_process,
    sample_envelopes,
)
from support.probes import Samples, get, samples
from support.workers import WorkerProcess, keel, services, services_env, unique_cartridge, wait_until

from keel.cartridge import load_cartridge
from keel.health import Health, HealthServer
from keel.ingress.auth import sign
from keel.logs import FIELDS, JsonFormatter, TextFormatter, dict_config


def scrape(port: int) -> Samples:
    status, text = get(f"http://127.0.0.1:{port}/metrics")
    assert status == 200, text
    return samples(text)


# ---- units ---------------------------------------------------------------------------------------

class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_loop_that_stops_turning_fails_liveness_and_readiness() -> None:
    clock = Clock()
    health = Health(stall_after_s=30, clock=clock)
    assert health.liveness()[0]                         # nothing registered yet: alive
    health.beat("consume")
    clock.now += 29
    assert health.liveness()[0] and health.readiness()[0]
    clock.now += 2
    live, doc = health.liveness()
    assert not live and doc["stalled"] == ["consume"] and doc["loops"]["consume"] == 31
    ready, doc = health.readiness()
    assert not ready and "progress" in doc["failing"]
    health.beat("consume")
    assert health.liveness()[0]
    clock.now += 100
    health.retire("consume")                            # a clean stop is not a stall
    assert health.liveness()[0]


def test_readiness_names_each_failing_check() -> None:
    health = Health()
    health.check("redis", lambda: None)
    health.check("kafka", lambda: "fetch failed: KafkaConnectionError")

    def broken() -> str | None:
        raise RuntimeError("boom")
    health.check("postgres", broken)
    ready, doc = health.readiness()
    assert not ready
    assert doc["failing"] == {"kafka": "fetch failed: KafkaConnectionError", "postgres": "RuntimeError: boom"}
    assert doc["checks"] == ["kafka", "postgres", "redis"]


def test_health_server_serves_probes_and_the_registry_over_http() -> None:
    clock = Clock()
    health = Health(stall_after_s=5, clock=clock)
    registry = CollectorRegistry()
    Counter("keel_test_things", "Things.", ["cartridge"], registry=registry).labels("c1").inc(3)
    ready = {"ok": False}
    health.check("assigned", lambda: None if ready["ok"] else "waiting")
    health.beat("loop")
    server = HealthServer(health, registry, 0, host="127.0.0.1").start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        assert get(f"{base}/healthz")[0] == 200
        status, body = get(f"{base}/readyz")
        assert status == 503 and json.loads(body)["failing"] == {"assigned": "waiting"}
        ready["ok"] = True
        assert get(f"{base}/readyz")[0] == 200
        assert scrape(server.port)[("keel_test_things_total", (("cartridge", "c1"),))] == 3
        clock.now += 6
        status, body = get(f"{base}/healthz")
        assert status == 503 and json.loads(body)["stalled"] == ["loop"]
        assert get(f"{base}/nothing")[0] == 404
    finally:
        server.stop()


def _record(message: str, **fields: Any) -> logging.LogRecord:
    record = logging.LogRecord("keel.worker.x", logging.WARNING, __file__, 1, message, (), None)
    if fields:
        setattr(record, FIELDS, fields)
    return record


def test_json_and_text_formats_carry_the_same_fields() -> None:
    doc = json.loads(JsonFormatter().format(_record("batch done", tool="search", miss=True)))
    assert set(doc) == {"ts", "level", "logger", "message", "tool", "miss"}
    assert doc["level"] == "warning" and doc["logger"] == "keel.worker.x" and doc["ts"].endswith("Z")
    text = TextFormatter().format(_record("batch done", tool="search", who="a b"))
    assert text.endswith(' WARNING keel.worker.x: batch done tool=search who="a b"')
    assert text[:len(doc["ts"])].endswith("Z")


def test_dict_config_sends_every_logger_through_one_formatter(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    before = logging.root.handlers[:], logging.root.level, logging.getLogger("keel").level
    try:
        logging.config.dictConfig(dict_config("json", "INFO"))
        logging.getLogger("keel.test").info("mine")
        logging.getLogger("aiokafka").info("library info is not shown")
        logging.getLogger("aiokafka").warning("library warning")
        lines = [json.loads(x) for x in stream.getvalue().splitlines()]
        assert [(x["logger"], x["message"]) for x in lines] == [("keel.test", "mine"), ("aiokafka", "library warning")]
    finally:
        logging.root.handlers[:] = before[0]
        logging.root.setLevel(before[1])
        logging.getLogger("keel").setLevel(before[2])


# ---- processes with real services ----------------------------------------------------------------

@services
@pytest.mark.timeout(300)
def test_worker_serves_health_readiness_and_metrics(tmp_path: Path) -> None:
    env = services_env()
    folder = unique_cartridge(tmp_path)
    name = load_cartridge(folder).name
    events = sum(1 for line in (folder / "events.jsonl").read_text().splitlines() if line.strip())
    keel("publish", str(folder), str(folder / "events.jsonl"), env=env)
    port = free_port()
    worker = WorkerProcess([folder], env, tmp_path / "worker.log", "--metrics-port", str(port),
                           "--log-format", "json")
    try:
        wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 120, "worker ready",
                   on_timeout=worker.text)
        wait_until(lambda: scrape(port).get(("keel_worker_events_applied_total", (("cartridge", name),))) == events,
                   120, "events applied")
        wait_until(lambda: (scrape(port).get(("keel_worker_commit_latency_seconds_count", (("cartridge", name),)))
                            or 0) >= 1, 30, "the batch's offsets committed (counted after its events)")
        got = scrape(port)
        assert got[("keel_worker_events_dead_lettered_total", (("cartridge", name),))] == 0
        assert got[("keel_worker_rebalances_total", (("cartridge", name),))] >= 1
        lags = {labels: v for (metric, labels), v in got.items() if metric == "keel_worker_partition_lag"}
        assert lags and all(v == 0 for v in lags.values())
        assert {dict(labels)["cartridge"] for labels in lags} == {name}
        assert got[("keel_worker_batch_size_count", (("cartridge", name),))] >= 1
        assert got[("keel_worker_commit_latency_seconds_count", (("cartridge", name),))] >= 1
        status, body = get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and f"consume {name}" in json.loads(body)["loops"]
        assert worker.terminate() == 0
        assert got[("keel_worker_ready", (("cartridge", name),))] == 1
        assert got[("keel_worker_seconds_since_commit", (("cartridge", name),))] < 3600
        # every log line is JSON, and no terminal escape code reaches the file (faust's spinner wrote them)
        text = worker.text()
        assert "\x1b" not in text and "\x08" not in text
        docs = [json.loads(line) for line in text.splitlines() if line.strip()]
        assert all({"ts", "level", "logger", "message"} <= set(d) for d in docs)
        assert any("assigned partitions" in d["message"] for d in docs)
    finally:
        if worker.alive():
            worker.kill()


@services
@pytest.mark.timeout(300)
def test_relay_serves_health_readiness_and_metrics(tmp_path: Path) -> None:
    env = ingress_env()
    folder = unique_cartridge(tmp_path)
    name = load_cartridge(folder).name
    schema_gen = fresh_schema(env["KEEL_POSTGRES_DSN"])
    schema = next(schema_gen)
    with psycopg.connect(env["KEEL_POSTGRES_DSN"], autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA IF NOT EXISTS {schema}")
    keel("outbox", "init", "--schema", schema, env=env)
    good = sample_envelopes()
    insert_all(env["KEEL_POSTGRES_DSN"], schema, [*good, "{\"not\": \"an envelope\"}"])
    port = free_port()
    relay = relay_process(folder, schema, env, tmp_path / "relay.log", "--metrics-port", str(port))
    try:
        wait_until(lambda: relay_caught_up(env["KEEL_POSTGRES_DSN"], schema, name), 120, "relay caught up")
        wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60, "relay ready")
        got = scrape(port)
        assert got[("keel_relay_events_relayed_total", (("cartridge", name),))] == len(good)
        assert got[("keel_relay_events_dead_lettered_total", (("cartridge", name),))] == 1
        assert got[("keel_relay_active", (("cartridge", name),))] == 1
        assert got[("keel_relay_commit_latency_seconds_count", (("cartridge", name),))] >= 1
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        assert relay.terminate() == 0
        assert " INFO keel.relay: " in relay.text()             # the text format, keel.logs fields
    finally:
        if relay.alive():
            relay.kill()
        next(schema_gen, None)


@services
@pytest.mark.timeout(300)
def test_webhook_serves_health_readiness_and_metrics(tmp_path: Path) -> None:
    env = ingress_env()
    folder = unique_cartridge(tmp_path)
    name = load_cartridge(folder).name
    tenant, secret = "hogar-demo", "s3cret-of-hogar-demo-0123"
    secrets_file = tmp_path / "secrets.yaml"
    secrets_file.write_text(f"{tenant}: {secret}\n")
    secrets_file.chmod(0o600)
    port = free_port()
    server = Background(["webhook", str(folder), "--port", "0", "--secrets", str(secrets_file),
                         "--metrics-port", str(port), "--log-format", "json"], env, tmp_path / "webhook.log")
    try:
        listen = int(server.wait_for_line(r"listening on http://127\.0\.0\.1:(\d+)").group(1))
        wait_until(lambda: get(f"http://127.0.0.1:{port}/readyz")[0] == 200, 60, "webhook ready")
        body = "".join(json.dumps(e) + "\n" for e in sample_envelopes()[:3]).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{listen}/events/{name}", data=body, method="POST",
                                         headers={"Content-Type": "application/x-ndjson", "X-Keel-Tenant": tenant,
                                                  "X-Keel-Signature": sign(secret, body)})
        with urllib.request.urlopen(request, timeout=30) as r:
            assert r.status == 202
        got = scrape(port)
        assert got[("keel_webhook_requests_total", (("cartridge", name), ("status", "202")))] == 1
        assert got[("keel_webhook_events_total", (("cartridge", name), ("outcome", "accepted")))] == 3
        assert got[("keel_webhook_request_latency_seconds_count", ())] == 1
        status, doc = get(f"http://127.0.0.1:{port}/healthz")
        assert status == 200 and "event loop" in json.loads(doc)["loops"]
        assert server.terminate() == 0
        docs = [json.loads(line) for line in server.text().splitlines() if line.strip()]
        assert all({"ts", "level", "logger", "message"} <= set(d) for d in docs)
    finally:
        if server.alive():
            server.kill()


@pytest.mark.parametrize("command", [["worker"], ["replay"], ["serve"], ["outbox", "relay"], ["webhook"]])
def test_every_process_command_takes_the_one_log_format(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """README: every process takes `--log-format text|json`; replay too (its warnings share the format)."""
    from keel.cli import main

    with pytest.raises(SystemExit) as done:
        main([*command, "--help"])
    assert done.value.code == 0
    assert "--log-format {text,json}" in capsys.readouterr().out
