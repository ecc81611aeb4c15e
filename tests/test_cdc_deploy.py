"""The change data capture parts of deploy/: the Kubernetes overlay deploy/k8s/cdc (Kafka Connect with the Debezium
connector, `keel cdc relay`) rendered and validated strictly against the Kubernetes schemas, its command lines
parsed by `keel`'s own parser; and the compose file's opt-in `cdc` profile."""
from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import yaml
from test_deploy_manifests import KUBERNETES_VERSION, by_kind, render

from keel.cartridge import load_cartridge
from keel.cli import build_parser
from keel.sources import compile_sources

ROOT = Path(__file__).resolve().parents[1]


def test_the_cdc_overlay_is_valid_probed_and_runs_a_real_keel_command() -> None:
    docs = render(ROOT / "deploy" / "k8s" / "cdc")
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    deployments = by_kind(docs, "Deployment")
    assert set(deployments) == {"keel-connect", "keel-cdc-relay"}
    relay = deployments["keel-cdc-relay"]["spec"]["template"]["spec"]
    [container] = relay["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.prefix == "product" and container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert relay["securityContext"]["runAsNonRoot"] is True
    configmaps = by_kind(docs, "ConfigMap")
    cartridge = next(c for n, c in configmaps.items() if n.startswith("keel-cdc-cartridge"))
    folder = ROOT / "examples" / "household"
    assert cartridge["data"]["cartridge.yaml"] == (folder / "cartridge.yaml").read_text()
    assert load_cartridge(folder).spec.sources                       # the mapping the relay needs
    connector = json.loads(next(c for n, c in configmaps.items()
                                if n.startswith("keel-connect-connector"))["data"]["household.json"])["config"]
    for key, value in {"plugin.name": "pgoutput", "publication.autocreate.mode": "disabled",
                       "decimal.handling.mode": "string", "tombstones.on.delete": "false",
                       "value.converter.schemas.enable": "false"}.items():
        assert connector[key] == value, key
    mapped = compile_sources(load_cartridge(folder).spec)[0]
    assert set(connector["table.include.list"].split(",")) == {s.spec.table for s in mapped.values()}


def test_the_compose_cdc_profile_is_opt_in_and_its_relay_parses() -> None:
    services = yaml.safe_load((ROOT / "deploy" / "compose.yaml").read_text())["services"]
    for name in ("connect", "cdc-relay"):
        assert services[name]["profiles"] == ["cdc"], name           # `docker-compose up` alone never starts them
        assert services[name]["healthcheck"]["test"]
    argv = [a.replace("${KEEL_CDC_CARTRIDGE:-household}", "household").replace("${KEEL_CDC_PREFIX:-product}",
                                                                                 "product")
            for a in services["cdc-relay"]["command"]]
    args = build_parser().parse_args(argv)
    assert args.cdc_command == "relay" and args.prefix == "product"
    assert (ROOT / "examples" / "household" / "cartridge.yaml").is_file()
