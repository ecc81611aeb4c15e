"""The Kubernetes manifests (deploy/k8s): rendered with kustomize, validated against the Kubernetes OpenAPI
schemas in strict mode (kubernetes-validate: types, required fields, no unknown field), then checked for
what Keel needs: every process is probed on its /healthz and /readyz, has resource requests, runs as
non-root; each command line parses with `keel`'s own parser; Services, PodDisruptionBudgets, ConfigMaps
and Secrets point at things that exist; one relay. And the compose file parses with its documented shape."""
from __future__ import annotations

import shlex
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from keel.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
K8S = ROOT / "deploy" / "k8s"
KUBERNETES_VERSION = "1.33"
KUSTOMIZE = "sigs.k8s.io/kustomize/kustomize/v5@v5.5.0"


def render(overlay: Path) -> list[dict[str, Any]]:
    """`kubectl kustomize` when kubectl is installed, else kustomize itself through `go run` (a Go module)."""
    if shutil.which("kubectl"):
        cmd = ["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone", str(overlay)]
    elif shutil.which("go"):
        cmd = ["go", "run", KUSTOMIZE, "build", "--load-restrictor", "LoadRestrictionsNone", str(overlay)]
    else:
        pytest.fail("neither kubectl nor go is installed: cannot render the kustomize overlay")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=600).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    return render(K8S / "example")


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def test_every_resource_is_valid_against_the_kubernetes_schemas_strictly(docs: list[dict[str, Any]]) -> None:
    kinds = sorted({d["kind"] for d in docs})
    assert kinds == ["ConfigMap", "Deployment", "Namespace", "PodDisruptionBudget", "Secret", "Service"]
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)      # raises on any violation
    broken = {**by_kind(docs, "Deployment")["keel-worker"]}
    broken["spec"] = {**broken["spec"], "replica": 2}
    with pytest.raises(kubernetes_validate.ValidationError):          # the validator does reject unknown fields
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_each_process_is_probed_limited_and_unprivileged(docs: list[dict[str, Any]]) -> None:
    deployments = by_kind(docs, "Deployment")
    assert set(deployments) == {"keel-worker", "keel-mcp", "keel-relay", "keel-webhook"}
    parser = build_parser()
    for name, d in deployments.items():
        pod = d["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        for c in pod.get("initContainers", []) + pod["containers"]:
            parser.parse_args(c["args"])                              # a real `keel` command line
            assert c["resources"]["requests"]["cpu"] and c["resources"]["requests"]["memory"], name
            assert c["securityContext"]["allowPrivilegeEscalation"] is False
        c = pod["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz", name
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz", name
        for probe in (c["livenessProbe"], c["readinessProbe"]):
            assert probe["httpGet"]["port"] in ports
        args = parser.parse_args(c["args"])
        if ports.get("metrics"):                                      # the probe server listens there
            env = {k: v for ref in c.get("envFrom", []) if "configMapRef" in ref
                   for k, v in by_kind(docs, "ConfigMap")[ref["configMapRef"]["name"]]["data"].items()}
            assert int(env["KEEL_METRICS_PORT"]) == ports["metrics"] and env["KEEL_METRICS_HOST"] == "0.0.0.0"
        else:                                                          # keel serve answers on its own port
            assert args.port == ports["http"] and args.host == "0.0.0.0"
    assert 1 <= deployments["keel-worker"]["spec"]["replicas"] <= 8                 # <= the topic's partitions
    relay = deployments["keel-relay"]["spec"]
    assert relay["replicas"] == 1 and relay["strategy"]["type"] == "Recreate"


def test_references_resolve(docs: list[dict[str, Any]]) -> None:
    deployments = by_kind(docs, "Deployment")
    configmaps, secrets = by_kind(docs, "ConfigMap"), by_kind(docs, "Secret")
    labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in deployments.items()}
    for kind in ("Service", "PodDisruptionBudget"):
        for name, doc in by_kind(docs, kind).items():
            selector = doc["spec"]["selector"]
            selector = selector.get("matchLabels", selector)
            assert [n for n, lab in labels.items() if selector.items() <= lab.items()] == [name], (kind, name)
    for name, d in deployments.items():
        pod = d["spec"]["template"]["spec"]
        for v in pod.get("volumes", []):
            if "configMap" in v:
                assert v["configMap"]["name"] in configmaps, (name, v)
            if "secret" in v:
                assert v["secret"]["secretName"] in secrets, (name, v)
        for c in pod.get("initContainers", []) + pod["containers"]:
            for ref in c.get("envFrom", []):
                if "configMapRef" in ref:
                    assert ref["configMapRef"]["name"] in configmaps
                else:
                    assert ref["secretRef"]["name"] in secrets
    cartridge = next(c for n, c in configmaps.items() if n.startswith("keel-cartridge"))
    assert "cartridge.yaml" in cartridge["data"]
    folder = ROOT / "cartridges" / yaml.safe_load(cartridge["data"]["cartridge.yaml"])["name"]
    assert all((folder / name).read_text() == text for name, text in cartridge["data"].items())
    assert ((folder / "handlers.py").exists()) == ("handlers.py" in cartridge["data"])    # what it needs to load


def test_compose_file_has_the_stack_with_health_checks_and_start_order() -> None:
    compose = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())
    services = compose["services"]
    assert {"kafka", "redis", "postgres", "worker-1", "worker-2", "mcp", "relay", "webhook"} <= set(services)
    assert "--appendonly" in services["redis"]["command"]
    parser = build_parser()
    for name, s in services.items():
        if s.get("image", "").startswith("${KEEL_IMAGE"):
            argv = [a.replace("${KEEL_CARTRIDGE:-finance}", "finance") for a in s["command"]]
            parser.parse_args(argv)
        if name != "outbox-init":
            assert s["healthcheck"]["test"], name
        for dep, cond in (s.get("depends_on") or {}).items():
            assert dep in services and cond["condition"] in ("service_healthy", "service_completed_successfully")
    assert shlex.join(services["mcp"]["command"]).count("--tokens") == 1


# ---- issue 44: what docs/operations.md recommends, deployed: Sentinel and three Kafka brokers -------------------

HA_KAFKA = {"KAFKA_DEFAULT_REPLICATION_FACTOR": "3", "KAFKA_MIN_INSYNC_REPLICAS": "2",
            "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR": "3", "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR": "3",
            "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR": "2", "KAFKA_UNCLEAN_LEADER_ELECTION_ENABLE": "false"}
SENTINEL_SETTINGS = ("sentinel monitor keel {primary} 6379 2", "sentinel down-after-milliseconds keel 2500",
                     "sentinel failover-timeout keel 6000", "sentinel resolve-hostnames yes")
REDIS_SETTINGS = ("--maxmemory-policy noeviction", "--min-replicas-to-write 1", "--min-replicas-max-lag 10",
                  "--appendonly yes")


def keel_commands(services: dict[str, Any]) -> dict[str, list[str]]:
    return {n: [a.replace("${KEEL_CARTRIDGE:-finance}", "finance") for a in s["command"]]
            for n, s in services.items() if s.get("image", "").startswith("${KEEL_IMAGE")}


def test_compose_ha_runs_sentinel_with_quorum_2_and_three_brokers_with_rf_3() -> None:
    services = yaml.safe_load((ROOT / "deploy" / "compose.ha.yaml").read_text())["services"]
    brokers = {n: s for n, s in services.items() if n.startswith("kafka-")}
    assert sorted(brokers) == ["kafka-1", "kafka-2", "kafka-3"]
    ids = set()
    for name, s in brokers.items():
        env = s["environment"]
        assert HA_KAFKA.items() <= env.items(), name
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "1@kafka-1:9093,2@kafka-2:9093,3@kafka-3:9093"
        assert env["KAFKA_ADVERTISED_LISTENERS"] == f"PLAINTEXT://{name}:9092"
        ids.add(env["KAFKA_NODE_ID"])
        assert s["volumes"] == [f"{name}-data:/var/lib/kafka/data"]            # a log dir each
    assert ids == {"1", "2", "3"}
    nodes = {n: shlex.join(s["command"]) for n, s in services.items() if n.startswith("redis-")}
    assert sorted(nodes) == ["redis-1", "redis-2"] and "--replicaof redis-1 6379" in nodes["redis-2"]
    assert all(setting in line for line in nodes.values() for setting in REDIS_SETTINGS), nodes  # on every node
    sentinels = {n: s for n, s in services.items() if n.startswith("sentinel-")}
    assert len(sentinels) == 3
    for s in sentinels.values():
        script = s["command"][-1]
        assert all(x.format(primary="redis-1") in script for x in SENTINEL_SETTINGS), script
    parser = build_parser()
    for name, argv in keel_commands(services).items():
        args = parser.parse_args(argv)
        if hasattr(args, "replication_factor"):
            assert args.replication_factor == 3, name                     # Keel's topics: RF 3
        s = services[name]
        assert s["environment"]["KEEL_REDIS_URL"] == ("redis+sentinel://sentinel-1:26379,sentinel-2:26379,"
                                                      "sentinel-3:26379/keel/0")
        assert s["environment"]["KEEL_KAFKA_BOOTSTRAP"] == "kafka-1:9092,kafka-2:9092,kafka-3:9092"
        for dep, cond in (s.get("depends_on") or {}).items():
            assert dep in services and cond["condition"] in ("service_healthy", "service_completed_successfully")
        if name != "outbox-init":
            assert s["healthcheck"]["test"], name
    assert {"kafka", "redis"}.isdisjoint(services)                          # no single broker or node left


def test_the_compose_sentinel_config_is_one_redis_server_accepts(tmp_path: Path) -> None:
    """The Sentinel lines compose.ha.yaml writes, run by a real `redis-server --sentinel` (the primary's name
    pointed at a local redis-server): it monitors `keel` with quorum 2, 2.5 s and 6 s."""
    import time

    import redis as redislib
    from support.redis_nodes import RedisNode, free_port
    services = yaml.safe_load((ROOT / "deploy" / "compose.ha.yaml").read_text())["services"]
    script = services["sentinel-1"]["command"][-1]
    lines = script.split("<<EOF\n", 1)[1].split("\nEOF", 1)[0].splitlines()
    primary = RedisNode(tmp_path / "primary").start()
    port = free_port()
    conf = tmp_path / "sentinel.conf"
    text = "\n".join(line.replace("$$SENTINEL_NAME", "127.0.0.1").replace("redis-1 6379", f"127.0.0.1 {primary.port}")
                     .replace("port 26379", f"port {port}").replace("dir /data", f"dir {tmp_path}") for line in lines)
    conf.write_text(text + "\n")
    binary = shutil.which("redis-server") or "/usr/bin/redis-server"
    proc = subprocess.Popen([binary, str(conf), "--sentinel"], stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    try:
        client = redislib.Redis(port=port, decode_responses=True)
        for _ in range(100):
            try:
                master = client.sentinel_master("keel")
                break
            except redislib.RedisError:
                time.sleep(0.1)
        else:
            raise AssertionError(f"sentinel on {port} did not answer (exit {proc.poll()})")
        assert (master["quorum"], master["down-after-milliseconds"], master["failover-timeout"]) == (2, 2500, 6000)
        assert int(master["port"]) == primary.port
    finally:
        proc.kill()
        proc.wait()
        primary.stop()


def test_k8s_ha_overlay_runs_sentinel_and_three_brokers_strictly_valid() -> None:
    docs = render(K8S / "ha")
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    sets = by_kind(docs, "StatefulSet")
    assert sets["redis"]["spec"]["replicas"] >= 2 and sets["keel-sentinel"]["spec"]["replicas"] == 3
    assert sets["kafka"]["spec"]["replicas"] == 3
    [kafka] = sets["kafka"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in kafka["env"]}
    assert HA_KAFKA.items() <= env.items()
    assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"] == "0@kafka-0.kafka:9093,1@kafka-1.kafka:9093,2@kafka-2.kafka:9093"
    assert "KAFKA_NODE_ID=${HOSTNAME##*-}" in kafka["command"][-1]            # distinct ids from the ordinal
    scripts = by_kind(docs, "ConfigMap")["keel-redis-scripts"]["data"]
    assert all(x.format(primary="redis-0.redis") in scripts["sentinel.sh"] for x in SENTINEL_SETTINGS)
    assert all(setting in scripts["redis.sh"] for setting in REDIS_SETTINGS)           # every node, same flags
    secret = by_kind(docs, "Secret")
    urls = [s.get("stringData", {}).get("KEEL_REDIS_URL") or s.get("data", {}).get("KEEL_REDIS_URL")
            for n, s in secret.items() if n.startswith("keel-services")]
    import base64
    [url] = [base64.b64decode(u).decode() if not u.startswith("redis") else u for u in urls if u]
    assert url.startswith("redis+sentinel://keel-sentinel-0.keel-sentinel:26379,keel-sentinel-1") and url.endswith("/keel/0")
    config = by_kind(docs, "ConfigMap")
    [cfg] = [c for n, c in config.items() if n.startswith("keel-config")]
    assert cfg["data"]["KEEL_KAFKA_BOOTSTRAP"] == "kafka-0.kafka:9092,kafka-1.kafka:9092,kafka-2.kafka:9092"
    parser = build_parser()
    for name, d in by_kind(docs, "Deployment").items():
        args = parser.parse_args(d["spec"]["template"]["spec"]["containers"][0]["args"])
        if hasattr(args, "replication_factor"):
            assert args.replication_factor == 3, name
    budgets = by_kind(docs, "PodDisruptionBudget")
    assert budgets["keel-sentinel"]["spec"]["minAvailable"] == 2 and budgets["kafka"]["spec"]["maxUnavailable"] == 1
