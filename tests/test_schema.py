"""Issue 29: `keel schema` prints JSON Schema (draft 2020-12) of a cartridge's envelopes and of each event type's
payload per version, validated here with `jsonschema`: the schemas are valid, every sample envelope of every
cartridge passes, and on payloads near the samples the schema and Keel's checks agree."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from support.versions import EVENTS, UPCASTER_2_TO_3, label_currency, variant, version_3

from keel.cartridge import load_cartridge
from keel.cli import main
from keel.envelope import Catalog
from keel.errors import EnvelopeRejected
from keel.schema import cartridge_document, payload_document

ROOT = Path(__file__).resolve().parents[1]
NAMES = ("finance", "fleet", "salon")
VALUES = ["text", 7, 2.5, True, None, "2026-09-05", "2026-09-05T10:00:00Z", {"a": 1}, [1]]


def validator(doc: dict[str, Any]) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def samples(name: str) -> list[dict[str, Any]]:
    path = ROOT / "cartridges" / name / "events.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def keel_accepts(catalog: Catalog, env: dict[str, Any]) -> bool:
    try:
        catalog.parse(json.dumps(env))
    except EnvelopeRejected:
        return False
    return True


@pytest.mark.parametrize("name", NAMES)
def test_every_sample_envelope_validates(name: str) -> None:
    cartridge = load_cartridge(ROOT / "cartridges" / name)
    check = validator(cartridge_document(cartridge))
    for env in samples(name):
        assert list(check.iter_errors(env)) == [], env["id"]
    for event_type in cartridge.spec.events:
        jsonschema.Draft202012Validator.check_schema(payload_document(cartridge, event_type))


def near(env: dict[str, Any]) -> list[dict[str, Any]]:
    """Envelopes one edit away from a sample: each payload field dropped or set to each of VALUES, a field
    added, the type changed; and the envelope's own fields likewise."""
    out = []
    payload = env["payload"]
    for field in [*payload, "extra"]:
        out.append({**env, "payload": {k: v for k, v in payload.items() if k != field}})
        out += [{**env, "payload": {**payload, field: value}} for value in VALUES]
    for field in ("id", "tenant", "subject", "occurred_at", "recorded_at", "source", "by", "version"):
        out += [{**env, field: value} for value in ["", "x y", "debt:visa", "2026-09-05", 3, None]]
    return out


@pytest.mark.parametrize("name", NAMES)
def test_the_schema_and_keel_agree_near_the_samples(name: str) -> None:
    """Where both can say (text shapes, types, required and unknown fields), a schema-valid envelope is one
    Keel accepts and the other way round. Times are approximated by a pattern, so the VALUES are real times."""
    cartridge = load_cartridge(ROOT / "cartridges" / name)
    check, catalog = validator(cartridge_document(cartridge)), Catalog(cartridge)
    disagree = []
    for env in samples(name):
        if env["type"].startswith("keel."):
            continue
        for changed in near(env):
            if check.is_valid(changed) != keel_accepts(catalog, changed):
                disagree.append(changed)
    assert disagree == []


def test_older_versions_are_the_upcast_steps_undone(tmp_path: Path) -> None:
    """Version 2 of debt.snapshot adds a required currency (version 1 has none), so a version-1 payload
    carrying one is refused by both; Keel and the schema agree on every version near the samples."""
    cartridge = load_cartridge(variant(tmp_path / "v2", label_currency))
    check, catalog = validator(cartridge_document(cartridge)), Catalog(cartridge)
    assert payload_document(cartridge, "debt.snapshot", 1)["required"] == [
        "balance_cop", "creditor", "installment_cop", "month", "product", "rate_ea_pct"]
    v2 = payload_document(cartridge, "debt.snapshot")
    assert v2["$id"].endswith(":debt.snapshot:v2") and "currency" in v2["required"]
    disagree = []
    for env in samples("finance"):
        upgraded = {**env, "version": 2, "payload": {**env["payload"], "currency": "USD"}}
        cases = [env, upgraded, *near(env)] + ([*near(upgraded)] if env["type"] == "debt.snapshot" else [])
        for changed in cases:
            if check.is_valid(changed) != keel_accepts(catalog, changed):
                disagree.append(changed)
    assert disagree == []
    first = samples("finance")[0]
    assert not check.is_valid({**first, "payload": {**first["payload"], "currency": "COP"}})     # v1 has none
    assert not check.is_valid({**first, "version": 3})                    # newer than the cartridge knows


def test_a_version_read_by_a_python_upcaster_is_any_object(tmp_path: Path) -> None:
    cartridge = load_cartridge(variant(tmp_path / "v3", version_3, handlers=UPCASTER_2_TO_3))
    schemas = {v: payload_document(cartridge, "debt.snapshot", v) for v in (1, 2, 3)}
    assert "properties" not in schemas[1] and "properties" not in schemas[2]
    assert "read by a Python upcaster" in schemas[2]["description"]
    assert schemas[3]["properties"]["period_start"]["format"] == "date"
    check = validator(cartridge_document(cartridge))
    for line in EVENTS.read_text().splitlines():
        assert check.is_valid(json.loads(line))


def test_keel_schema_prints_the_documents(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    folder = variant(tmp_path / "v2", label_currency)
    assert main(["schema", str(folder)]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert {"debt.snapshot.v1", "debt.snapshot.v2", "due.paid.v1", "keel.annotated.v1"} <= set(doc["$defs"])
    assert main(["schema", str(folder), "--event", "debt.snapshot", "--version", "1"]) == 0
    assert "currency" not in json.loads(capsys.readouterr().out)["properties"]
    assert main(["schema", str(folder), "--event", "debt.vanished"]) == 2
    assert "unknown event type 'debt.vanished'" in capsys.readouterr().err
    assert main(["schema", str(folder), "--event", "debt.snapshot", "--version", "3"]) == 2
    assert "debt.snapshot has versions 1 to 2, not 3" in capsys.readouterr().err
