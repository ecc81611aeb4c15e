"""Issue 29: versioned event types. Older envelopes are upcast (YAML steps, Python upcasters, chained) before
they are checked and projected; the log is never rewritten (identity, evidence, `keel publish` keep the
envelope as recorded); a version newer than the cartridge knows is reported in file mode, and on a worker
stops its partition at that record, skipping nothing, until a cartridge that knows it runs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from support.versions import (
    EVENTS,
    FINANCE,
    UPCASTER_2_TO_3,
    add_currency,
    label_currency,
    snapshot,
    variant,
    version_3,
)
from support.workers import topic_records

from keel.cartridge import load_cartridge
from keel.digest import digest
from keel.embedded import build_embedded
from keel.envelope import Catalog
from keel.errors import CartridgeInvalid, EnvelopeRejected, UsageError, VersionUnknown
from keel.kafka import GroupDescription, GroupMember, PartitionOffsets
from keel.projector import Projector
from keel.store.memory import MemoryStore
from keel.tools import Tools
from workers.applier import BatchApplier
from workers.replay_build import PartitionBuild
from workers.status import commit_metadata, render_status, shape_status

LINES = [json.loads(line) for line in EVENTS.read_text().splitlines() if line.strip()]
FIRST_SNAPSHOT = LINES[0]             # snap-visa-2026-09: debt.snapshot, version 1 (no `version`)


def raw(env: dict[str, Any]) -> bytes:
    return json.dumps(env).encode()


def write(path: Path, envelopes: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(e) + "\n" for e in envelopes))
    return path


@pytest.fixture(scope="module")
def v3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return variant(tmp_path_factory.mktemp("v3") / "finance", version_3, handlers=UPCASTER_2_TO_3)


# ---- upcasting ------------------------------------------------------------------------------------

def test_yaml_steps_and_a_python_upcaster_chain_over_two_versions(v3: Path) -> None:
    catalog = Catalog(load_cartridge(v3))
    one = catalog.parse(raw(FIRST_SNAPSHOT))
    p = FIRST_SNAPSHOT["payload"]
    assert one.version == 1 and one.recorded_payload == p                  # read as version 3
    assert one.payload == {"creditor": p["creditor"], "product": p["product"], "balance": p["balance_cop"],
                           "rate_ea_pct": p["rate_ea_pct"], "installment_cop": p["installment_cop"],
                           "month": "2026-09", "currency": "COP", "period_start": "2026-09-01"}
    two = {**FIRST_SNAPSHOT, "id": "v2", "version": 2,
           "payload": {**{k: v for k, v in p.items() if k != "balance_cop"}, "balance": 5, "currency": "USD"}}
    assert catalog.parse(raw(two)).payload == {**two["payload"], "period_start": "2026-09-01"}   # Python only
    three = {**two, "id": "v3", "version": 3, "payload": {**two["payload"], "period_start": "2026-09-15"}}
    event = catalog.parse(raw(three))
    assert event.payload == three["payload"] and event.recorded_payload is None and event.version == 3


def test_the_log_is_never_rewritten(v3: Path) -> None:
    """An upcast event keeps the identity of the envelope as recorded: its content hash (so a worker that
    switched cartridges takes a redelivered record as a duplicate), its canonical form (what `keel publish`
    sends) and its id as the evidence of what it wrote."""
    old, new = Catalog(load_cartridge(FINANCE)), Catalog(load_cartridge(v3))
    for env in LINES:
        before, after = old.parse(raw(env)), new.parse(raw(env))
        assert after.content_hash() == before.content_hash()
        assert after.to_envelope() == before.to_envelope()
        assert "version" not in after.to_envelope()
    explicit = new.parse(raw({**FIRST_SNAPSHOT, "version": 1}))           # `version: 1` is the same envelope
    assert explicit.content_hash() == old.parse(raw(FIRST_SNAPSHOT)).content_hash()
    three = new.parse(raw({**FIRST_SNAPSHOT, "version": 3, "payload": new.parse(raw(FIRST_SNAPSHOT)).payload}))
    assert three.content_hash() != explicit.content_hash() and three.to_envelope()["version"] == 3
    projector, report = build_embedded(load_cartridge(v3), EVENTS)
    assert report.rejected == [] and report.applied == len(LINES)
    tools = Tools(load_cartridge(v3), projector.store, "hogar-demo")
    history = tools.history("debt:visa", predicate="balance")
    assert [v["evidence"] for v in history["versions"]] == [e["id"] for e in LINES if e["subject"] == "debt:visa"
                                                           and e["type"] == "debt.snapshot"]
    assert tools.context("debt:visa")["labels"]["currency"] == "COP"


def test_a_redelivered_record_is_a_duplicate_after_the_cartridge_changed(v3: Path) -> None:
    """Applied under version 1 of the catalog, then read again by a cartridge at version 3: same event."""
    store = MemoryStore()
    Projector(load_cartridge(FINANCE), store).apply_raw(raw(FIRST_SNAPSHOT), origin="at line 1")
    _, outcome = Projector(load_cartridge(v3), store).apply_raw(raw(FIRST_SNAPSHOT), origin="at line 1")
    assert outcome == "duplicate"


def test_upcast_payloads_are_checked_and_refusals_say_why(tmp_path: Path, v3: Path) -> None:
    catalog = Catalog(load_cartridge(v3))
    p = FIRST_SNAPSHOT["payload"]
    cases = {
        "already has currency": ({**p, "currency": "USD"}, 1,
                                 ("upcast from version 1 (to 2, events.debt.snapshot.upcast.1): payload.currency: "
                                 "version 1 has no field currency (its upcast to version 2 adds it)")),
        "balance of the wrong type": ({**p, "balance_cop": "a lot"}, 1,
                                      "upcast from version 1 to 3: payload.balance: expected number, got 'a lot'"),
        "month missing (the upcaster fails)": ({k: v for k, v in p.items() if k != "month"}, 1,
                                               "upcaster snapshot_2_to_3 of handlers.py failed: KeyError: 'month'"),
        "unknown field survives": ({**p, "colour": "red"}, 1, "payload.colour: unknown field for debt.snapshot"),
    }
    for name, (payload, version, reason) in cases.items():
        with pytest.raises(EnvelopeRejected) as e:
            catalog.parse(raw({**FIRST_SNAPSHOT, "version": version, "payload": payload}))
        assert reason in e.value.reason, name
        assert e.value.event_id == FIRST_SNAPSHOT["id"] and e.value.tenant == "hogar-demo"
    assert p == FIRST_SNAPSHOT["payload"] and "currency" not in p           # nothing changed the input


def test_a_python_upcaster_must_return_a_payload_and_be_deterministic(tmp_path: Path) -> None:
    handlers = '''from keel import Registry
import itertools
registry = Registry()
_calls = itertools.count()

@registry.upcast("debt.snapshot", 1)
def snapshot_1_to_2(payload):
    if payload["month"] == "2026-10":
        return ["not", "a", "payload"]
    payload["currency"] = "COP" if next(_calls) % 2 == 0 else "USD"     # not deterministic
    return payload
'''
    def edit(doc: dict[str, Any]) -> None:
        add_currency(doc)
        del snapshot(doc)["upcast"]
    folder = variant(tmp_path / "f", edit, handlers=handlers)
    cartridge = load_cartridge(folder)
    october = next(e for e in LINES if e["type"] == "debt.snapshot" and e["payload"]["month"] == "2026-10")
    with pytest.raises(EnvelopeRejected, match="upcaster snapshot_1_to_2 of handlers.py returned a list, not a "
                                               "payload"):
        Catalog(cartridge).parse(raw(october))
    Catalog(cartridge).parse(raw(FIRST_SNAPSHOT))                  # file mode and workers call it once
    with pytest.raises(EnvelopeRejected, match="snapshot_1_to_2 of handlers.py is not deterministic"):
        Catalog(cartridge, check_upcasters=True).parse(raw(FIRST_SNAPSHOT))      # keel validate: twice


@pytest.mark.parametrize(("edit", "problem"), [
    (lambda e: e.update(version=2), ("events.debt.snapshot: no upcast from version 1 to 2 (add `upcast: {1: "
                                    "[steps]}`, or @registry.upcast('debt.snapshot', 1) in handlers.py)")),
    (lambda e: e.update(upcast={1: [{"add": {"currency": "COP"}}]}),
     "events.debt.snapshot.upcast.1: not a version below debt.snapshot's version 1"),
    (lambda e: e.update(version=2, upcast={1: [{"add": {"currency": "COP"}}]}),
     ("events.debt.snapshot.upcast.1[0].add.currency: adds currency, which is not a field of version 2 after this "
     "step")),
    (lambda e: e.update(version=2, upcast={1: [{"drop": "month"}]}),
     "events.debt.snapshot.upcast.1[0].drop: drops month, which version 2 has after this step"),
    (lambda e: e.update(version=2, upcast={1: [{"rename": {"month": "balance_cop"}}]}),
     "events.debt.snapshot.upcast.1[0].rename.month: month is still a field of version 2 after it is renamed"),
    (lambda e: e.update(version=2, upcast={1: [{"rename": {"balance": "amount"}}]}),
     "events.debt.snapshot.upcast.1[0].rename.balance: renames to amount, which is not a field of version 2"),
    (lambda e: (e.update(version=2, upcast={1: [{"add": {"rate": "{month}"}}]}),
                e["payload"].update(rate="number")),
     "events.debt.snapshot.upcast.1[0].add.rate: copies month (a string) into rate, a number"),
    (lambda e: (e.update(version=2, upcast={1: [{"add": {"rate": "high"}}]}), e["payload"].update(rate="number")),
     "events.debt.snapshot.upcast.1[0].add.rate: 'high' is not a number, the type of rate"),
    (lambda e: (e.update(version=2, upcast={1: [{"add": {"rate": "{nothing}"}}]}),
                e["payload"].update(rate="string")),
     "events.debt.snapshot.upcast.1[0].add.rate: {nothing}: no such field at this step"),
    (lambda e: e.update(version=2, upcast={1: [{"move": {"a": "b"}}]}),
     "events.debt.snapshot.upcast.1[0]: a step is a mapping with one key, one of add, rename, drop"),
    (lambda e: e.update(version="2"), "events.debt.snapshot.version: Input should be a valid integer"),
    (lambda e: e.update(version=0), "events.debt.snapshot.version: Input should be greater than or equal to 1"),
])
def test_upcast_steps_are_checked_when_the_cartridge_loads(tmp_path: Path, edit: Any, problem: str) -> None:
    folder = variant(tmp_path / "f", lambda doc: edit(snapshot(doc)))
    with pytest.raises(CartridgeInvalid) as e:
        load_cartridge(folder)
    assert any(problem in p for p in e.value.problems), e.value.problems


def test_python_upcasters_are_checked_like_handlers(tmp_path: Path) -> None:
    handlers = '''from keel import Registry
registry = Registry()

@registry.upcast("debt.snapshot", 1)
def a(payload):
    return payload

@registry.upcast("debt.snapshot", 1)
def b(payload):
    return payload

@registry.upcast("debt.vanished", 1)
def c(payload):
    return payload

@registry.upcast("due.paid", 1)
def d(payload):
    return payload
'''
    folder = variant(tmp_path / "f", add_currency, handlers=handlers)
    with pytest.raises(CartridgeInvalid) as e:
        load_cartridge(folder)
    assert sorted(e.value.problems) == sorted([
        "events.debt.snapshot.upcast.1: has steps and a Python upcaster in handlers.py; keep one",
        "handlers.py: 2 upcasters for 'debt.snapshot' from version 1; exactly one is allowed",
        "handlers.py: upcaster for 'debt.vanished', which is not an event type of the catalog",
        ("handlers.py: upcaster for 'due.paid' from version 1: due.paid has only version 1 (declare `version:` in "
        "cartridge.yaml)")])


# ---- a newer version than the cartridge knows -----------------------------------------------------

NEWER = {**FIRST_SNAPSHOT, "id": "snap-visa-v2", "occurred_at": "2026-09-02", "version": 2,
         "payload": {**FIRST_SNAPSHOT["payload"], "currency": "USD"}}


def test_a_newer_version_is_reported_in_file_mode(tmp_path: Path) -> None:
    with pytest.raises(VersionUnknown) as e:
        Catalog(load_cartridge(FINANCE)).parse(raw(NEWER))
    assert e.value.reason == ("debt.snapshot version 2 is newer than this cartridge knows (version 1): run a "
                              "cartridge that knows it")
    events = write(tmp_path / "e.jsonl", [*LINES[:5], NEWER, *LINES[5:]])
    _, report = build_embedded(load_cartridge(FINANCE), events)
    assert [(r.line, r.event_id) for r in report.rejected] == [(6, "snap-visa-v2")]
    assert report.applied == len(LINES)
    with pytest.raises(VersionUnknown, match="keel.annotated version 2 is newer"):
        Catalog(load_cartridge(FINANCE)).parse(raw({
            "id": "n1", "tenant": "hogar-demo", "type": "keel.annotated", "subject": "debt:visa", "version": 2,
            "occurred_at": "2026-09-05", "payload": {"predicate": "x", "value": 1, "scope": "tenant"}}))


def test_a_worker_stops_the_partition_at_a_newer_version_and_resumes_with_the_new_cartridge(tmp_path: Path) -> None:
    """The batch logic (no Kafka): the held record and every later record of its partition are left out of the
    plan (nothing dead-lettered, nothing skipped, the watermark stops before it); other partitions go on. A
    worker with a cartridge that knows the version, on the same store, applies the rest in order, and every
    tenant equals the embedded build under that cartridge."""
    other = [{**e, "tenant": "casa-otra", "id": f"o-{e['id']}"} for e in LINES]    # another tenant, maybe partition
    stream = [*LINES[:5], NEWER, *LINES[5:], *other]
    records = topic_records([(e["tenant"].encode(), raw(e)) for e in stream], partitions=4)
    held_record = next(r for r in records if b"snap-visa-v2" in (r.value or b""))
    tp = (held_record.topic, held_record.partition)
    store = MemoryStore()
    old = BatchApplier(load_cartridge(FINANCE), store)
    plan = old.plan(records)
    assert plan.dead_letters == [] and list(plan.held) == [tp]
    held = plan.held[tp]
    assert (held.record.offset, held.event_type, held.version, held.known) == (held_record.offset, "debt.snapshot",
                                                                              2, 1)
    assert "stopped at offset 5: a record of debt.snapshot version 2, newer than this cartridge knows" in held.reason
    assert plan.through[tp] == held_record.offset - 1
    old.commit(plan)
    applied = set(store.event_ids("hogar-demo"))
    after = [e["id"] for e, r in zip(stream, records, strict=True) if (r.topic, r.partition) == tp
             and r.offset > held_record.offset and e["tenant"] == "hogar-demo"]
    assert applied == {e["id"] for e in LINES[:5]} and not applied & set(after)
    assert store.partitions_applied(held_record.topic, [held_record.partition]) == {held_record.partition:
                                                                                    held_record.offset - 1}
    if all(r.partition != held_record.partition for r in records if r.key == b"casa-otra"):
        assert len(store.event_ids("casa-otra")) == len(other)                # its partition went on
    assert old.plan(records).held == plan.held                              # redelivered: held again, same place

    new_cartridge = load_cartridge(variant(tmp_path / "v2", add_currency))
    new = BatchApplier(new_cartridge, store)
    plan = new.plan(records)
    assert plan.held == {} and plan.dead_letters == []
    new.commit(plan)
    oracle = _timed(new_cartridge, records)
    for tenant in ("hogar-demo", "casa-otra"):
        assert digest(store, tenant) == digest(oracle, tenant)
    assert set(store.event_ids("hogar-demo")) == {e["id"] for e in stream if e["tenant"] == "hogar-demo"}


def _timed(cartridge: Any, records: list[Any]) -> MemoryStore:
    """The embedded oracle of records: each envelope with its record's time as recorded_at (as a worker
    defaults it), applied in partition order (what a worker's per-tenant order is)."""
    store = MemoryStore()
    projector = Projector(cartridge, store)
    for r in sorted(records, key=lambda r: (r.partition, r.offset)):
        projector.apply_raw(r.value, default_recorded_at=r.timestamp_micros, origin=r.origin)
    return store


def test_a_record_applied_before_a_rollback_is_skipped_not_held(tmp_path: Path) -> None:
    """A worker with the new cartridge applied the version-2 record; rolled back to the old cartridge, a
    worker skips it by its applied offset instead of stopping there."""
    records = topic_records([(e["tenant"].encode(), raw(e)) for e in [*LINES[:5], NEWER]], partitions=1)
    store = MemoryStore()
    BatchApplier(load_cartridge(variant(tmp_path / "v2", add_currency)), store).commit(
        BatchApplier(load_cartridge(variant(tmp_path / "v2b", add_currency)), store).plan(records))
    old = BatchApplier(load_cartridge(FINANCE), store)
    plan = old.plan(records)
    assert plan.held == {} and plan.skipped == len(records)


def test_a_replay_refuses_to_skip_a_newer_version() -> None:
    records = topic_records([(e["tenant"].encode(), raw(e)) for e in [*LINES[:5], NEWER]], partitions=1)
    build = PartitionBuild(load_cartridge(FINANCE), lambda t: True)
    with pytest.raises(UsageError, match="debt.snapshot version 2 is newer than this cartridge knows .*no tenant of "
                                         "partition 0 was switched"):
        build.feed(records)


def test_label_currency_variant_projects_the_upcast_field(tmp_path: Path) -> None:
    projector, report = build_embedded(load_cartridge(variant(tmp_path / "f", label_currency)), EVENTS)
    assert report.rejected == []
    labels = Tools(projector.cartridge, projector.store, "hogar-demo").context("debt:libranza")["labels"]
    assert labels["currency"] == "COP"


def test_keel_status_says_a_partition_is_held() -> None:
    """The worker commits the held record's offset with a note (workers/held.py); `keel status` shows it while
    the group's commit is still there, and forgets it once a later commit moved past it."""
    why = {"offset": 8, "type": "debt.snapshot", "version": 2, "known": 1}
    held, later = commit_metadata("keel-worker-h-1", held=why), commit_metadata("keel-worker-h-1")
    group = GroupDescription("Stable", (GroupMember("m1", "keel-worker-h-1", "/10.0.0.1", (0, 1, 2)),))
    partitions = [PartitionOffsets(0, 18, 8, 10, held), PartitionOffsets(1, 20, 20, 0, later),
                  PartitionOffsets(2, 30, 12, 18, held)]            # 2: committed past the note's offset
    doc = shape_status("finance", partitions, group, {}, None, None, {}, now=1e9)
    assert [p["held"] for p in doc["partitions"]] == [why, None, None]
    assert doc["problems"][0] == ("partition 0: stopped at offset 8, a record of debt.snapshot version 2, newer "
                                  "than the workers' cartridge knows (version 1); nothing after it is applied until "
                                  "the workers run a cartridge that knows it (deploy it; check it first with `keel "
                                  "validate <cartridge> --kafka`)")
    assert "HELD (newer version)" in render_status(doc)
