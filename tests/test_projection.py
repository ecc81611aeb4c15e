"""Declarative projections (keel.projection): same graph as the Python handlers they replace, every naming
problem reported at once, runtime checks as the handler API makes them."""
from __future__ import annotations

import io
import json
import random
import shutil
from pathlib import Path

import pytest
import yaml
from support.twins import python_twin
from support.workers import WorkerProcess, keel, redis_digests, services_env, unique_cartridge, wait_applied

from keel import CartridgeInvalid, HandlerFailed, MemoryStore, Projector, load_cartridge, reading
from keel.digest import digest
from keel.embedded import build_embedded

ROOT = Path(__file__).resolve().parents[1]
CARTRIDGES = sorted(p.parent for p in (ROOT / "cartridges").glob("*/cartridge.yaml"))


def varied_stream(folder: Path, path: Path, seed: int = 11) -> Path:
    """The sample stream, then each event again under a new id with optional payload fields dropped at random
    and its world time moved a few days (late events, corrections at shared points)."""
    cartridge = load_cartridge(folder)
    rng = random.Random(seed)
    events = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines() if line.strip()]
    out = list(events)
    for round_ in range(3):
        for e in events:
            if e["type"].startswith("keel."):
                continue
            v = json.loads(json.dumps(e))
            v["id"] = f"{e['id']}-v{round_}"
            for name, field in cartridge.spec.events[e["type"]].fields().items():
                if field.optional and rng.random() < 0.5:
                    v["payload"].pop(name, None)
            day = int(v["occurred_at"][8:10])
            v["occurred_at"] = v["occurred_at"][:8] + f"{max(1, min(28, day + rng.randint(-3, 3))):02d}" + \
                v["occurred_at"][10:]
            v.pop("recorded_at", None)
            out.append(v)
    path.write_text("".join(json.dumps(e) + "\n" for e in out))
    return path


def digests(folder: Path, events: Path) -> dict[str, str]:
    err = io.StringIO()
    projector, report = build_embedded(load_cartridge(folder), events, stream=err)
    return {t: digest(projector.store, t) for t in sorted(report.tenants)} | {"rejected": err.getvalue()}


@pytest.mark.parametrize("folder", CARTRIDGES, ids=lambda p: p.name)
def test_declarative_and_python_versions_build_the_same_digest(folder: Path, tmp_path: Path) -> None:
    doc = yaml.safe_load((folder / "cartridge.yaml").read_text())
    assert any("project" in e for e in doc["events"].values()), "the shipped cartridge has declarative steps"
    twin = python_twin(folder, tmp_path)
    assert not any(getattr(h, "declarative", False) for h in load_cartridge(twin).registry._handlers.values())
    for events in (folder / "events.jsonl", varied_stream(folder, tmp_path / "varied.jsonl")):
        declarative, python = digests(folder, events), digests(twin, events)
        assert declarative == python
        assert len(declarative) > 1


def test_a_fully_declarative_cartridge_needs_no_handlers_py(tmp_path: Path) -> None:
    folder = tmp_path / "finance"
    shutil.copytree(ROOT / "cartridges" / "finance", folder)
    assert not (folder / "handlers.py").exists()
    cartridge = load_cartridge(folder)
    assert all(getattr(cartridge.registry.handler(ev), "declarative", False) for ev in cartridge.spec.events)


BAD = """
name: shop
entities:
  order: {}
  customer: {}
relations:
  placed_by: {from: order, to: customer}
events:
  order.placed:
    subject: order
    owner: shop
    payload: {customer: string, total: number, note: optional string}
    project:
      - upsert: {labels: {total: "{totl}", ref: "x", Bad-Name: 1}}
      - link: {relation: placed_for, to: "customer:{customer}"}
      - link: {relation: placed_by, to: "order:{customer}"}
      - facts: {subject: "client:{customer}", set: {total: "{event.amount}", Bad: 1}}
      - facts: {at: "not a time", set: {note: "{note:>5}", seen: "{customer:date}", day: "{event.tenant:date}"}}
      - close: {facts: []}
      - facts: {at: 2026-01-05, set: {shipped_on: 2026-01-05}}
      - upsert: {type: shipment, id: "{customer}"}
      - tally: {x: 1}
      - link: {relation: placed_by, to: "{customer}", colour: red, at: null}
  order.sent:
    subject: order
    owner: shop
    project:
      - facts: {set: {status: sent}}
  order.lost:
    subject: order
    owner: shop
"""


def test_validate_reports_every_problem_of_the_projections_at_once(tmp_path: Path) -> None:
    folder = tmp_path / "shop"
    folder.mkdir()
    (folder / "cartridge.yaml").write_text(BAD)
    (folder / "handlers.py").write_text("from keel import Registry\nregistry = Registry()\n\n\n"
                                        "@registry.on('order.sent')\ndef sent(event, store):\n    pass\n")
    with pytest.raises(CartridgeInvalid) as info:
        load_cartridge(folder)
    problems = "\n".join(info.value.problems)
    where = "events.order.placed.project"
    for expected in (
        f"{where}[0].upsert.labels.total: {{totl}}: not a payload field of this event type",
        f"{where}[0].upsert.labels.ref: label names look like lowercase_words",
        f"{where}[0].upsert.labels.Bad-Name: label names",
        f"{where}[1].link.relation: 'placed_for' is not a relation of the cartridge",
        f"{where}[2].link.to: placed_by: the to end is a 'customer', not a 'order'",
        f"{where}[3].facts.subject: 'client' is not an entity type of the cartridge",
        f"{where}[3].facts.set.total: {{event.amount}}: the event has no attribute 'amount'",
        f"{where}[3].facts.set: predicate 'Bad'",
        f"{where}[4].facts.at: 'not a time' is not a time",
        f"{where}[4].facts.set.note: '{{note:>5}}': a placeholder takes no conversion, and no format but :date",
        f"{where}[4].facts.set.seen: {{customer:date}}: customer is not a date or datetime field",
        f"{where}[4].facts.set.day: {{event.tenant:date}}: only occurred_at and recorded_at are times",
        f"{where}[5].close.facts: expected a list of predicates",
        f"{where}[6].facts.set.shipped_on: expected a JSON scalar, got a YAML date (quote it to keep it as text)",
        f"{where}[7].upsert.type: 'shipment' is not an entity type of the cartridge",
        f"{where}[8]: a step is a mapping with one key",
        f"{where}[9].link.colour: unknown key",
        f"{where}[9].link.at: None is not a time",
        "events.order.sent: has `project:` steps and a Python handler in handlers.py; keep one",
        "events.order.lost: no handler",
    ):
        assert expected in problems, expected


def test_runtime_checks_and_failures_are_those_of_the_handler_api(tmp_path: Path) -> None:
    """A bad id built from the payload fails the event as HandlerFailed with the same reason either way."""
    folder = ROOT / "cartridges" / "finance"
    twin = python_twin(folder, tmp_path)
    bad = {"id": "q-bad", "tenant": "t1", "type": "due.scheduled", "subject": "due:q1", "occurred_at": "2026-01-01",
           "payload": {"debt_id": "no spaces allowed", "due_on": "2026-01-05", "amount_cop": 5}}
    reasons = []
    for f in (folder, twin):
        projector = Projector(load_cartridge(f), MemoryStore())
        with pytest.raises(HandlerFailed) as info:
            projector.apply_raw(bad)
        reasons.append(str(info.value))
        assert projector.store.event_ids("t1") == []          # nothing of the failed event is written
    assert reasons[0] == reasons[1] and "bad entity" in reasons[0]


def test_values_never_become_code(tmp_path: Path) -> None:
    folder = tmp_path / "quotes"
    folder.mkdir()
    nasty = "'\"); import os  # {{not a placeholder}} \\n"
    (folder / "cartridge.yaml").write_text(yaml.safe_dump({
        "name": "quotes", "entities": {"thing": {}},
        "events": {"thing.seen": {"subject": "thing", "owner": "x", "payload": {"said": "optional string"},
                                  "project": [{"upsert": {"labels": {"said": "{said}", "fixed": nasty}}},
                                              {"facts": {"set": {"echo": "<{said}>", "word": nasty}}}]}}}))
    projector = Projector(load_cartridge(folder), MemoryStore())
    for i, payload in enumerate(({"said": "x'}{y"}, {})):
        projector.apply_raw({"id": f"e{i}", "tenant": "t", "type": "thing.seen", "subject": f"thing:a{i}",
                             "occurred_at": "2026-01-01", "payload": payload})
    shown = reading.entity_info(projector.store, "t", "thing:a0")
    assert shown.labels == {"fixed": "'\"); import os  # {not a placeholder} \\n", "said": "x'}{y"}
    facts = {f["predicate"]: f["value"] for f in reading.facts(projector.store, "t", "thing:a0")}
    assert facts == {"echo": "<x'}{y>", "word": "'\"); import os  # {not a placeholder} \\n"}
    # an absent optional field leaves out the label and the fact that use it, and nothing else
    assert reading.entity_info(projector.store, "t", "thing:a1").labels == {"fixed": "'\"); import os  # {not a placeholder} \\n"}
    assert [f["predicate"] for f in reading.facts(projector.store, "t", "thing:a1")] == ["word"]


@pytest.mark.services
@pytest.mark.timeout(600)
def test_through_the_workers_the_declarative_and_python_versions_build_the_same_graph(tmp_path: Path) -> None:
    """One worker serving each shipped cartridge and its all-Python twin (unique names, fresh topics), fed the
    same varied stream: equal Redis digests, equal to the embedded build."""
    env = services_env()
    pairs = []
    for folder in CARTRIDGES:
        declared = unique_cartridge(tmp_path / "declared", folder.name)
        twin = python_twin(unique_cartridge(tmp_path / "python", folder.name), tmp_path / "python")
        events = varied_stream(folder, tmp_path / f"{folder.name}.jsonl")
        for f in (declared, twin):
            keel("publish", str(f), str(events), "--quiet", env=env)
        pairs.append((declared, twin, events))
    worker = WorkerProcess([f for declared, twin, _ in pairs for f in (declared, twin)], env, tmp_path / "worker.log")
    try:
        for declared, twin, events in pairs:
            expected = digests(declared, events)
            assert expected.pop("rejected") == ""
            count = sum(1 for line in events.read_text().splitlines() if line.strip())
            for f in (declared, twin):
                wait_applied(f, env, count, worker)
                assert redis_digests(f, env, expected) == expected
    finally:
        worker.kill()


def test_the_date_format_is_the_utc_calendar_day(tmp_path: Path) -> None:
    folder = tmp_path / "days"
    folder.mkdir()
    (folder / "cartridge.yaml").write_text(yaml.safe_dump({
        "name": "days", "entities": {"thing": {}},
        "events": {"thing.seen": {"subject": "thing", "owner": "x", "payload": {"at": "datetime"},
                                  "project": [{"upsert": {"labels": {"day": "{at:date}",
                                                                     "seen": "on {event.occurred_at:date}"}}}]}}}))
    projector = Projector(load_cartridge(folder), MemoryStore())
    projector.apply_raw({"id": "e1", "tenant": "t", "type": "thing.seen", "subject": "thing:a",
                         "occurred_at": "2026-03-01T23:30:00-05:00", "payload": {"at": "2026-02-28T21:00:00-05:00"}})
    assert reading.entity_info(projector.store, "t", "thing:a").labels == {"day": "2026-03-01", "seen": "on 2026-03-02"}
