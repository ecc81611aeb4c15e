"""The deploy tier: the images built from deploy/ and the stack run in containers on loopback, through the
`testcontainers` package (its reaper is off: TESTCONTAINERS_RYUK_DISABLED=true, every container is removed
here). Kafka and Redis come from deploy/images (a registry-free base made by `deploy/engine base`), Keel's
processes from deploy/Containerfile, all built by `deploy/engine images` under the names `deploy/engine names`
prints (the ones compose.yaml and the docs use). The finance sample is published, two workers apply it, the
five tools answer over the MCP server's HTTP endpoint with a bearer token, /metrics and /readyz answer; then a
worker container is killed mid-stream and the digests in Redis still equal the embedded build's. Last, the
compose file (deploy/compose.yaml) is brought up for real with deploy/compose-up (docker-compose): first with a
cartridge that does not exist, so that it fails naming the crash-looping services, then as the docs say; it
answers over MCP.

Runs under `make test` (scripts/with-engine starts a Docker engine when there is none); skipped without
DOCKER_HOST unless KEEL_REQUIRE_SERVICES=1."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anyio
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "bench"))

from common import finance_events
from support.mcp_sessions import fact, finance_story, http_session, ok
from support.probes import get, samples
from support.workers import embedded_digests, write_jsonl

from keel.cartridge import load_cartridge

pytestmark = [pytest.mark.timeout(1500)]
TENANT = "hogar-demo"
PREFIX = f"keeldeploy{uuid.uuid4().hex[:6]}"


def engine() -> str:
    host = os.environ.get("DOCKER_HOST")
    if not host:
        if os.environ.get("KEEL_REQUIRE_SERVICES") == "1":
            pytest.fail("DOCKER_HOST is not set but KEEL_REQUIRE_SERVICES=1 (run through `make test`)")
        pytest.skip("DOCKER_HOST not set: run `make test` or `eval \"$(deploy/engine up)\"; export DOCKER_HOST`")
    os.environ.setdefault("TESTCONTAINERS_RYUK_DISABLED", "true")
    return host


def wait(predicate: Callable[[], bool], timeout: float, what: str, why: Callable[[], str] = lambda: "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}\n{why()}")


# ---- images --------------------------------------------------------------------------------------

def run(*cmd: str, timeout: float = 900) -> str:
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc.stdout


@pytest.fixture(scope="module")
def images() -> dict[str, str]:
    """keel, keel-kafka, keel-redis and keel-postgres as `deploy/engine images` builds them on the local base
    (layers cached by the engine): {KEEL_IMAGE: "keel:local", KEEL_KAFKA_IMAGE: …}, compose.yaml's variables."""
    engine()
    run(str(ROOT / "deploy" / "engine"), "images", timeout=1800)
    names = dict(line.split("=", 1) for line in run(str(ROOT / "deploy" / "engine"), "names").split())
    assert set(names) == {"KEEL_IMAGE", "KEEL_KAFKA_IMAGE", "KEEL_REDIS_IMAGE", "KEEL_POSTGRES_IMAGE"}, names
    return names


# ---- the stack with testcontainers ---------------------------------------------------------------

class Stack:
    """Kafka, Redis, two workers and the MCP server on one network; Keel processes read /work (a host folder)."""

    def __init__(self, images: dict[str, str], work: Path, stack: ExitStack) -> None:
        from testcontainers.core.container import DockerContainer
        from testcontainers.core.network import Network
        self.images, self.work, self.stack = images, work, stack
        self.DockerContainer = DockerContainer
        self.network = stack.enter_context(Network())
        self.kafka = self._start(DockerContainer(images["KEEL_KAFKA_IMAGE"]), "kafka", env={
            "CLUSTER_ID": "kEeLkEeLkEeLkEeLkEeL0A", "KAFKA_NODE_ID": "1",
            "KAFKA_PROCESS_ROLES": "broker,controller",
            "KAFKA_LISTENERS": "PLAINTEXT://:9092,CONTROLLER://:9093",
            "KAFKA_ADVERTISED_LISTENERS": "PLAINTEXT://kafka:9092",
            "KAFKA_CONTROLLER_LISTENER_NAMES": "CONTROLLER",
            "KAFKA_LISTENER_SECURITY_PROTOCOL_MAP": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "KAFKA_CONTROLLER_QUORUM_VOTERS": "1@kafka:9093", "KAFKA_NUM_PARTITIONS": "8",
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "1", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "1",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "1", "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_REPLICATION_FACTOR": "1",
            "KAFKA_SHARE_COORDINATOR_STATE_TOPIC_MIN_ISR": "1", "KAFKA_GROUP_INITIAL_REBALANCE_DELAY_MS": "0",
            "KAFKA_HEAP_OPTS": "-Xmx384m"})
        self.redis = self._start(DockerContainer(images["KEEL_REDIS_IMAGE"]), "redis")
        wait(lambda: self.kafka.exec(["/opt/kafka/bin/kafka-topics.sh", "--bootstrap-server", "localhost:9092",
                                      "--list"]).exit_code == 0, 180, "Kafka", self.kafka_logs)
        wait(lambda: self.redis.exec(["redis-cli", "ping"]).output.strip() == b"PONG", 60, "Redis")

    def kafka_logs(self) -> str:
        return b"".join(self.kafka.get_logs()).decode(errors="replace")[-3000:]

    def _start(self, container: Any, alias: str, *, env: dict[str, str] | None = None,
               ports: tuple[int, ...] = ()) -> Any:
        container = container.with_network(self.network).with_network_aliases(alias).with_name(f"{PREFIX}-{alias}")
        for k, v in (env or {}).items():
            container = container.with_env(k, v)
        if ports:
            container = container.with_exposed_ports(*ports)
        self.stack.callback(container.stop)
        return container.start()

    def keel(self, alias: str, *args: str, ports: tuple[int, ...] = ()) -> Any:
        """A Keel process (the one image) with the work folder mounted read-only at /work."""
        c = self.DockerContainer(self.images["KEEL_IMAGE"]).with_command(list(args)) \
            .with_volume_mapping(str(self.work), "/work", "ro")
        return self._start(c, alias, ports=ports, env={"KEEL_KAFKA_BOOTSTRAP": "kafka:9092",
                                                       "KEEL_REDIS_URL": "redis://redis:6379/0",
                                                       "KEEL_METRICS_PORT": "9100"})

    def once(self, *args: str) -> str:
        """`keel <args>` in a one-off container; its output once it exited 0."""
        c = self.keel(f"once-{uuid.uuid4().hex[:6]}", *args)
        client = c.get_wrapped_container()
        status = client.wait(timeout=300)
        out = client.logs(stderr=False).decode(errors="replace")
        assert status["StatusCode"] == 0, \
            f"keel {' '.join(args)} exited {status['StatusCode']}:\n{client.logs().decode(errors='replace')}"
        return out

    def url(self, container: Any, port: int, path: str) -> str:
        return f"http://127.0.0.1:{container.get_exposed_port(port)}{path}"


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The cartridge, events and tokens file the containers read (they run as uid 10001): the tokens file as
    `keel token --tokens` made it, under a strict umask, as the docs say to make it."""
    work = tmp_path_factory.mktemp("deploy-work")
    shutil.copytree(ROOT / "cartridges" / "finance", work / "finance")
    more = [{**e, "recorded_at": e["occurred_at"]} for e in finance_events(1500, 12, seed=5)]
    write_jsonl(work / "more.jsonl", more)
    for p in [work, *work.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    token = subprocess.run([sys.executable, "-m", "keel.cli", "token", "--tenant", TENANT, "--agent", "deploy",
                            "--tokens", str(work / "tokens.jsonl")], check=True, capture_output=True, text=True,
                           cwd=ROOT, umask=0o077).stdout.strip()
    (work / "token").write_text(token)
    return work


def applied(stack: Stack, workers: list[Any]) -> float:
    total = 0.0
    for w in workers:
        status, text = get(stack.url(w, 9100, "/metrics"))
        if status == 200:
            total += sum(v for (name, _), v in samples(text).items() if name == "keel_worker_events_applied_total")
    return total


def test_the_stack_answers_over_mcp_survives_a_killed_worker_and_keeps_digests(images: dict[str, str],
                                                                                 work: Path) -> None:
    cartridge = load_cartridge(work / "finance")
    sample = sum(1 for line in (work / "finance" / "events.jsonl").read_text().splitlines() if line.strip())
    with ExitStack() as es:
        stack = Stack(images, work, es)
        stack.once("publish", "/work/finance", "/work/finance/events.jsonl")
        workers = [stack.keel(f"worker-{i}", "worker", "/work/finance", "--quiet", "--batch", "200",
                              ports=(9100,)) for i in (1, 2)]
        mcp = stack.keel("mcp", "serve", "/work/finance", "--transport", "http", "--host", "0.0.0.0",
                         "--port", "8765", "--tokens", "/work/tokens.jsonl", ports=(8765,))
        for w in workers:
            wait(lambda w=w: get(stack.url(w, 9100, "/readyz"))[0] == 200, 180, "worker /readyz",
                 lambda w=w: b"".join(w.get_logs()).decode(errors="replace")[-3000:])
        wait(lambda: applied(stack, workers) >= sample, 180, "the sample applied")
        wait(lambda: get(stack.url(mcp, 8765, "/readyz"))[0] == 200, 120, "MCP /readyz")

        # the five tools over HTTP with the token, through the mcp SDK's client
        token = (work / "token").read_text()

        async def story() -> None:
            async with http_session(stack.url(mcp, 8765, "/mcp"), token) as s:
                await finance_story(s, None)
                assert fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop")["value"] == 3870000
        anyio.run(story)

        metrics = samples(get(stack.url(workers[0], 9100, "/metrics"))[1])
        assert ("keel_worker_rebalances_total", (("cartridge", cartridge.name),)) in metrics
        # a worker reports the lag of the partitions it owns (an idle one every few seconds); the sample is one
        # tenant, so one of the two workers may own no partition with records
        wait(lambda: any(name == "keel_worker_partition_lag" for w in workers
                         for name, _ in samples(get(stack.url(w, 9100, "/metrics"))[1])), 60,
             "a worker's keel_worker_partition_lag")
        tool_calls = samples(get(stack.url(mcp, 8765, "/metrics"))[1])
        assert sum(v for (n, _), v in tool_calls.items() if n == "keel_tool_calls_total") >= 5

        # a worker container killed (SIGKILL) while more events arrive: the other one takes its partitions
        stack.once("publish", "/work/finance", "/work/more.jsonl")
        workers[0].get_wrapped_container().kill()
        total = sample + sum(1 for line in (work / "more.jsonl").read_text().splitlines() if line.strip())
        survivor = workers[1]
        wait(lambda: json.loads(stack.once("status", "/work/finance", "--json"))["lag"] == 0, 300, "lag 0")
        assert get(stack.url(survivor, 9100, "/readyz"))[0] == 200
        expected = embedded_digests(cartridge, work / "more.jsonl")      # (hogar-demo has the story's note too)
        assert TENANT not in expected and len(expected) == 12
        for tenant, digest in expected.items():
            out = stack.once("digest", "/work/finance", "--tenant", tenant, "--redis", "redis://redis:6379/0")
            assert digest in out, (tenant, out)
        assert total > sample


# ---- the compose file, for real ------------------------------------------------------------------

@pytest.fixture
def compose(images: dict[str, str], work: Path) -> Iterator[tuple[list[str], dict[str, str]]]:
    """docker-compose (Debian's 1.29, installed when missing) on deploy/compose.yaml, taken down afterwards."""
    exe = shutil.which("docker-compose")
    if exe is None:
        run("sh", "-c", "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq docker-compose")
        exe = shutil.which("docker-compose")
    assert exe, "docker-compose is not installed"
    secrets = work / "webhook-secrets.yaml"
    secrets.write_text(f'{TENANT}: "a-long-random-webhook-secret-0123"\n')
    os.chown(secrets, 10001, 10001) if os.geteuid() == 0 else secrets.chmod(0o644)
    env = {**os.environ, **images, "KEEL_CARTRIDGES": str(work), "KEEL_TOKENS_FILE": str(work / "tokens.jsonl"),
           "KEEL_WEBHOOK_SECRETS": str(secrets), "KEEL_MCP_PORT": "0", "KEEL_WEBHOOK_PORT": "0"}
    cmd = [exe, "-p", PREFIX, "-f", str(ROOT / "deploy" / "compose.yaml")]
    try:
        yield cmd, env
    finally:
        subprocess.run([*cmd, "down", "-v", "--remove-orphans"], check=False, env=env, capture_output=True, timeout=300)


def test_the_compose_stack_comes_up_healthy_and_answers_over_mcp(compose: tuple[list[str], dict[str, str]],
                                                                 work: Path) -> None:
    cmd, env = compose

    def sh(*args: str, timeout: float = 600) -> str:
        proc = subprocess.run([*cmd, *args], check=False, env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc.stdout

    def compose_up(**more: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(ROOT / "deploy" / "compose-up"), *cmd[1:]], check=False, env={**env, **more},
                              capture_output=True, text=True, timeout=900)

    # before anything starts: a file the stack mounts that is missing, or that uid 10001 cannot read, is refused
    missing = compose_up(KEEL_TOKENS_FILE=str(work / "no-tokens.jsonl"))
    assert missing.returncode == 2 and f"{work / 'no-tokens.jsonl'} does not exist" in missing.stderr, missing.stderr
    private = work / "private-tokens.jsonl"
    private.write_text((work / "tokens.jsonl").read_text())
    private.chmod(0o600)
    if os.stat(private).st_uid != 10001:
        refused = compose_up(KEEL_TOKENS_FILE=str(private))
        assert refused.returncode == 2, refused.stderr
        assert f"{private} is mode 600" in refused.stderr and "chmod o+r" in refused.stderr, refused.stderr
    assert not sh("ps", "-q").strip()                                         # nothing was started

    # a cartridge that is not there: Kafka, Redis and PostgreSQL come up, every Keel process exits 2 at start
    # and is restarted again and again; compose-up says which, with their last log lines, and exits 1
    broken = compose_up(KEEL_CARTRIDGE="no-such-cartridge")
    assert broken.returncode == 1, broken.stderr[-3000:]
    assert re.search(r"ERROR:   (worker-1|worker-2|mcp|relay|webhook): \S+ is crash-looping: restarted \d+ times"
                     r"(, last exit code 2)?\n", broken.stderr), broken.stderr[-3000:]
    assert re.search(r"ERROR:   worker-1: ", broken.stderr)                # never healthy: named too, with its log
    assert "---- worker-1: last 40 log lines ----" in broken.stderr
    assert "/cartridges/no-such-cartridge: not a folder" in broken.stderr
    assert not re.search(r"ERROR:   (kafka|redis|postgres): .*(crash-looping|unhealthy|exited)", broken.stderr), \
        broken.stderr[-3000:]

    # as the docs say: compose-up returns once every service is healthy (outbox-init exited 0)
    up = compose_up()
    assert up.returncode == 0, up.stderr[-5000:]
    table = dict(line.split(None, 1) for line in up.stdout.splitlines())
    assert table.pop("outbox-init").endswith(" exited 0 (one-shot)"), up.stdout
    assert table and all(state.endswith(" healthy") for state in table.values()), up.stdout
    sh("run", "--rm", "--no-deps", "worker-1", "publish", "/cartridges/finance", "/cartridges/finance/events.jsonl")
    port = sh("port", "mcp", "8765").strip().rsplit(":", 1)[1]
    token = (work / "token").read_text()

    async def story() -> None:
        async with http_session(f"http://127.0.0.1:{port}/mcp", token) as s:
            for _ in range(120):
                found = await s.call_tool("search", {"query": "visa"})
                if found.is_error:  # the worker has not applied the tenant's first event yet
                    assert "unknown tenant" in found.content[0].text, found.content[0].text
                    await anyio.sleep(0.5)
                    continue
                got = fact(await ok(s, "context", {"entity": "debt:visa"}), "balance_cop") \
                    if "debt:visa" in json.dumps(found.structured_content) else None
                if got is not None:
                    assert got["value"] == 3870000
                    return
                await anyio.sleep(0.5)
            raise AssertionError("debt:visa never answered over the compose stack's MCP server")
    anyio.run(story)
