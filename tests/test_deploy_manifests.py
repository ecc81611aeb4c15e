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
