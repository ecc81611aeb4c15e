"""deploy/prometheus: the alerting rules pass `promtool check rules`, their unit tests (`promtool test rules
keel-alerts.test.yaml`) pass, the example prometheus.yml passes `promtool check config`; every rule reads only
series Keel exports, and every alert has a severity, a summary, a description, a section in docs/operations.md
and a unit test in which it fires.

promtool comes from Debian's `prometheus` package (`scripts/ensure-promtool`, run by `make test`, installs it).
Without it these tests skip, or fail under KEEL_REQUIRE_SERVICES=1."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.metric_names import PENDING, exported, metric_names, pending_report

ROOT = Path(__file__).resolve().parents[1]
RULES_DIR = ROOT / "deploy" / "prometheus"
RULES = RULES_DIR / "keel-alerts.yaml"
RULE_TESTS = RULES_DIR / "keel-alerts.test.yaml"
EXAMPLE_CONFIG = RULES_DIR / "prometheus.example.yml"


@pytest.fixture(scope="module")
def promtool() -> str:
    path = shutil.which("promtool")
    if path:
        return path
    reason = "promtool is not installed (Debian's prometheus package: scripts/ensure-promtool, or apt-get install prometheus)"
    if os.environ.get("KEEL_REQUIRE_SERVICES") == "1":
        pytest.fail(f"{reason} but KEEL_REQUIRE_SERVICES=1")
    pytest.skip(reason)


def run(promtool: str, *args: str, cwd: Path = RULES_DIR) -> subprocess.CompletedProcess[str]:
    return subprocess.run([promtool, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


def rules() -> list[dict[str, Any]]:
    return [rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]]


def alerts() -> dict[str, dict[str, Any]]:
    return {rule["alert"]: rule for rule in rules() if "alert" in rule}


def test_promtool_checks_the_rules(promtool: str) -> None:
    done = run(promtool, "check", "rules", RULES.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(rules())} rules found" in done.stdout


def test_the_rules_unit_tests_pass(promtool: str) -> None:
    done = run(promtool, "test", "rules", RULE_TESTS.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_catches_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    """The unit tests do test the thresholds: the same tests against rules with one threshold changed fail."""
    shutil.copy(RULE_TESTS, tmp_path / RULE_TESTS.name)
    text = RULES.read_text()
    assert text.count("keel_worker_seconds_since_commit > 120") == 1
    (tmp_path / RULES.name).write_text(text.replace("keel_worker_seconds_since_commit > 120",
                                                    "keel_worker_seconds_since_commit > 1200"))
    done = run(promtool, "test", "rules", RULE_TESTS.name, cwd=tmp_path)
    assert done.returncode != 0
    assert "alertname: KeelWorkerNotCommitting" in done.stdout + done.stderr


def test_the_example_prometheus_config_loads_the_rules(promtool: str) -> None:
    done = run(promtool, "check", "config", EXAMPLE_CONFIG.name)
    assert done.returncode == 0, done.stdout + done.stderr
    assert yaml.safe_load(EXAMPLE_CONFIG.read_text())["rule_files"] == [RULES.name]


def test_rules_read_only_series_keel_exports() -> None:
    known = exported()
    pending_report(known)
    recorded = {rule["record"] for rule in rules() if "record" in rule}
    unknown = {}
    for rule in rules():
        names = metric_names(rule["expr"]) - known - PENDING - recorded
        if names:
            unknown[rule.get("alert") or rule["record"]] = sorted(names)
    assert unknown == {}
    assert all(":" in name for name in recorded)     # the recording-rule naming convention: level:metric:ops


def test_every_alert_is_documented_and_fires_in_a_unit_test() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())
    assert tests["rule_files"] == [RULES.name]
    fired = {case["alertname"] for test in tests["tests"] for case in test.get("alert_rule_test", [])
             if case["exp_alerts"]}
    quiet = {case["alertname"] for test in tests["tests"] for case in test.get("alert_rule_test", [])
             if not case["exp_alerts"]}
    operations = (ROOT / "docs" / "operations.md").read_text()
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in {"critical", "warning"}, name
        assert rule["annotations"]["summary"] and rule["annotations"]["description"], name
        assert name in fired, f"{name}: no unit test in which it fires"
        assert name in quiet, f"{name}: no unit test in which it stays quiet"
        assert f"`{name}`" in operations, f"{name}: not described in docs/operations.md"
