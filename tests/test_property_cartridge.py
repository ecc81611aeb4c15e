"""Issue 40: the defects a new user met writing a property-management cartridge from the docs alone
(tests/data/property): `{event.*}` times in `project:` values, `keel schema` and sealed personal fields, a YAML
slip's cascade of problems, and the mask of notes after an erasure. Each test reproduces one and proves its fix."""
from __future__ import annotations

import base64
import copy
import json
import shutil
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import test_privacy_kafka
import yaml
from support.workers import WorkerProcess, embedded_digests, keel, redis_digests, services, wait_applied

from keel import reading
from keel.cartridge import load_cartridge
from keel.cli import main
from keel.errors import CartridgeInvalid
from keel.schema import SEALED, cartridge_document, payload_document

FIXTURE = Path(__file__).resolve().parent / "data" / "property"
TENANT = "casa-norte"
MASTER = bytes(range(32))
SLIPPED = ('{description: "A rentable unit, inside a property"}', "{description: A rentable unit, inside a property}")
keyed_env = test_privacy_kafka.keyed_env      # the fixture: Kafka, Redis, the master key, a PostgreSQL key store
PERSONAL_VALUES = ["Lucía Restrepo", "+57 300 555 0199", "lucia@example.org",
                   "Lucía reports a leak under the kitchen sink"]


def clear_envelopes() -> list[dict[str, Any]]:
    return [json.loads(line) for line in (FIXTURE / "events.jsonl").read_text(encoding="utf-8").splitlines()]


@pytest.fixture
def master(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_MASTER_KEY", base64.b64encode(MASTER).decode())
    monkeypatch.delenv("KEEL_MASTER_KEY_FILE", raising=False)


@pytest.fixture
def sealed(tmp_path: Path, master: None, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, Path]:
    """(cartridge copy, the fixture's events sealed by `keel seal`, its key file)"""
    folder = tmp_path / "property"
    shutil.copytree(FIXTURE, folder)
    out, keys = tmp_path / "sealed.jsonl", tmp_path / "keys.json"
    assert main(["seal", str(folder), str(folder / "events.jsonl"), str(out), "--keys", str(keys)]) == 0
    assert "8 lines, 3 sealed, 0 refused" in capsys.readouterr().out
    return folder, out, keys


def facts_of(graph: Any, entity: str) -> dict[str, Any]:
    return {f["predicate"]: f["value"] for f in graph.tools(tenant=TENANT, agent="a1").context(entity)["facts"]}


# ---- {event.occurred_at} in a project: value ---------------------------------------------------------------

EXPECTED_TIMES = {
    "renter:r-001": {"registered_at": "2026-01-20T20:30:00Z"},
    "lease:l-2026-01": {"signed_at": "2026-01-25T16:00:00Z", "signed_day": "2026-01-25"},
    "invoice:inv-2026-02": {"issued_at": "2026-02-01T08:00:00Z", "entered_at": "2026-02-01T08:00:02.500000Z",
                            "note": "issued 2026-02-01T08:00:00Z for 2026-02"},
    "request:mr-7": {"opened_at": "2026-02-03T19:45:00Z"},
}


def test_event_times_project_their_rfc3339_text(sealed: tuple[Path, Path, Path],
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """Every event applies (before the fix each one with an {event.occurred_at} value was refused: 'a Instant is
    not a JSON value'), and the value is the text Keel prints that time as, alone or inside text."""
    import keel as api
    from keel.times import format_time, parse_time
    folder, out, keys = sealed
    assert main(["validate", str(folder), str(out), "--keys", str(keys)]) == 0
    assert "8 events ok" in "".join(capsys.readouterr())
    with api.open(folder, events=out, keys=keys) as graph:
        for entity, expected in EXPECTED_TIMES.items():
            facts = facts_of(graph, entity)
            assert {k: facts[k] for k in expected} == expected, entity
        context = graph.tools(tenant=TENANT, agent="a1").context("invoice:inv-2026-02")
        [issued] = [f for f in context["facts"] if f["predicate"] == "issued_at"]
        assert issued["value"] == issued["valid_from"]                      # the same text as Keel's own times
        assert issued["value"] == format_time(parse_time("2026-02-01T08:00:00Z"))


def write_variant(tmp_path: Path, change: Any) -> Path:
    """A copy of the fixture with `change(doc)` applied to its cartridge.yaml (as data)."""
    folder = tmp_path / "variant"
    shutil.copytree(FIXTURE, folder)
    doc = yaml.safe_load((folder / "cartridge.yaml").read_text(encoding="utf-8"))
    change(doc)
    (folder / "cartridge.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True),
                                           encoding="utf-8")
    return folder


def test_validate_refuses_a_placeholder_that_projects_no_json_value_naming_the_step(tmp_path: Path) -> None:
    """What a placeholder can only turn into a refused value (or a failing step) when applied is refused by
    `keel validate`, naming the step: an object field inside text, a ref that is not text, a time in an entity
    id, a step time naming a field that never holds one."""
    def change(doc: dict[str, Any]) -> None:
        doc["events"]["invoice.noted"] = {
            "subject": "invoice", "owner": "billing",
            "payload": {"amount": "number", "period": "string", "lines": "object", "paid": "boolean"},
            "project": [{"upsert": {"ref": "{amount}", "labels": {"lines": "{lines}", "text": "lines: {lines}"}}},
                        {"link": {"relation": "billed_on", "to": "lease:{event.occurred_at}"}},
                        {"facts": {"at": "{paid}", "set": {"seen": "{event.recorded_at}"}}},
                        {"close": {"at": "{period}", "facts": ["seen"]}}]}       # a string may hold a time
    with pytest.raises(CartridgeInvalid) as info:
        load_cartridge(write_variant(tmp_path, change))
    where = "events.invoice.noted.project"
    assert info.value.problems == [
        (f"{where}[0].upsert.ref: {{amount}} is a number field; a ref is a pointer, text: write it inside text "
         "(\"<system>#{amount}\")"),
        (f"{where}[0].upsert.labels.text: 'lines: {{lines}}': {{lines}} is an object field, which has no text "
         "form; use it alone (\"{lines}\") to keep it as JSON"),
        (f"{where}[1].link.to: {{event.occurred_at}} is a time (RFC 3339 holds ':', which an entity id cannot); "
         "use {event.occurred_at:date}, the calendar day"),
        (f"{where}[2].facts.at: {{paid}} is a boolean field, never a time: name a date or datetime field, or "
         "{event.occurred_at} / {event.recorded_at}"),
    ]


def test_event_by_is_left_out_when_the_event_has_none(tmp_path: Path) -> None:
    """`{event.by}` names null when the envelope has no `by`: like an optional field, what uses it is left out
    (never the text 'None')."""
    from keel import MemoryStore, Projector

    def change(doc: dict[str, Any]) -> None:
        doc["events"]["property.added"]["project"].append({"facts": {"set": {"added_by": "{event.by}",
                                                                             "who": "by {event.by}"}}})
        del doc["personal"]
    projector = Projector(load_cartridge(write_variant(tmp_path, change)), MemoryStore())
    base = clear_envelopes()[0]
    projector.apply_raw({**base, "id": "p-by", "by": "ana"})
    projector.apply_raw({**base, "id": "p-none", "subject": "property:oak-3"})
    facts = {e: {f["predicate"]: f["value"] for f in reading.facts(projector.store, TENANT, e)}
             for e in ("property:elm-12", "property:oak-3")}
    assert facts == {"property:elm-12": {"added_by": "ana", "who": "by ana"}, "property:oak-3": {}}


@services
def test_through_a_worker_the_times_project_as_embedded(tmp_path: Path, keyed_env: dict[str, str]) -> None:
    """The worker path (Kafka -> worker -> Redis; `keel publish` seals) builds the embedded graph, the time texts
    included. The projection has no Lua mirror: the worker runs the same compiled function as the embedded
    build, and Redis stores the values it wrote."""
    from support.workers import unique_cartridge

    from keel.store.redis import RedisStore
    folder = unique_cartridge(tmp_path, FIXTURE)
    keel("publish", str(folder), str(FIXTURE / "events.jsonl"), "--partitions", "2", env=keyed_env)
    worker = WorkerProcess([folder], keyed_env, tmp_path / "worker.log")
    try:
        wait_applied(folder, keyed_env, len(clear_envelopes()), worker)
    finally:
        assert worker.terminate() == 0
    cartridge = load_cartridge(folder)
    assert redis_digests(folder, keyed_env, [TENANT]) == embedded_digests(cartridge, FIXTURE / "events.jsonl")
    store = RedisStore.from_url(keyed_env["KEEL_REDIS_URL"], namespace=cartridge.name)
    try:
        for entity, expected in EXPECTED_TIMES.items():
            facts = {f["predicate"]: f["value"] for f in reading.facts(store, TENANT, entity)}
            assert {k: facts[k] for k in expected} == expected, entity
    finally:
        store.close()


# ---- keel schema and sealed personal fields ------------------------------------------------------------------

def validator(doc: dict[str, Any]) -> jsonschema.Draft202012Validator:
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


def read_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def test_the_schema_validates_the_sealed_records_of_the_topic(sealed: tuple[Path, Path, Path]) -> None:
    """`keel schema` describes the records as they are on the topic: personal fields sealed. Every record `keel
    seal` wrote validates (before the fix every sealed one failed: "… is not of type 'string'"); a record with a
    personal field in clear, which Keel refuses there, fails at that field."""
    folder, out, _ = sealed
    cartridge = load_cartridge(folder)
    check = validator(cartridge_document(cartridge))
    sealed_records = read_lines(out)
    assert sum("keel.enc" in json.dumps(e) for e in sealed_records) == 3
    for env in sealed_records:
        assert list(check.iter_errors(env)) == [], env["id"]
    refused = {}
    for env in clear_envelopes():
        errors = sorted(".".join(str(p) for p in e.absolute_path) for e in check.iter_errors(env))
        if errors:
            refused[env["id"]] = errors
    assert refused == {"r-1": ["payload.email", "payload.name", "payload.phone"],
                       "r-2": ["payload.name", "payload.phone"], "q-1": ["payload.summary"]}
    altered = copy.deepcopy(sealed_records[2])
    altered["payload"]["name"]["kid"] = "not a key id"
    assert not check.is_valid(altered)
    assert payload_document(cartridge, "renter.registered")["properties"]["name"]["anyOf"] == [SEALED]
    email = payload_document(cartridge, "renter.registered")["properties"]["email"]["anyOf"]
    assert email == [SEALED, {"type": "null"}]                              # optional: sealing keeps a null


def test_the_clear_variant_describes_envelopes_before_sealing(sealed: tuple[Path, Path, Path],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """`keel schema --clear` is the form `keel seal`, `keel publish`, the outbox relay and the webhook take:
    the clear records validate, the sealed ones do not."""
    folder, out, _ = sealed
    assert main(["schema", str(folder), "--clear"]) == 0
    check = validator(json.loads(capsys.readouterr().out))
    assert all(check.is_valid(env) for env in clear_envelopes())
    assert [env["id"] for env in read_lines(out) if not check.is_valid(env)] == ["r-1", "r-2", "q-1"]
    assert main(["schema", str(folder), "--event", "renter.registered", "--clear"]) == 0
    assert json.loads(capsys.readouterr().out)["properties"]["name"] == {"type": "string"}
    assert main(["schema", str(folder)]) == 0
    on_topic = validator(json.loads(capsys.readouterr().out))
    assert all(on_topic.is_valid(env) for env in read_lines(out))


def test_with_accept_clear_the_schema_takes_either_form(tmp_path: Path, sealed: tuple[Path, Path, Path]) -> None:
    _, out, _ = sealed

    def change(doc: dict[str, Any]) -> None:
        doc["personal"]["accept_clear"] = True
    check = validator(cartridge_document(load_cartridge(write_variant(tmp_path, change))))
    assert all(check.is_valid(env) for env in [*read_lines(out), *clear_envelopes()])
    bad = copy.deepcopy(clear_envelopes()[2])
    bad["payload"]["name"] = 7                                              # neither sealed nor a string
    assert not check.is_valid(bad)


# ---- a YAML slip, and the cascade it caused ----------------------------------------------------------------

def slipped(tmp_path: Path, good: str = SLIPPED[0], bad: str = SLIPPED[1]) -> Path:
    folder = tmp_path / "slip"
    shutil.copytree(FIXTURE, folder)
    text = (folder / "cartridge.yaml").read_text(encoding="utf-8")
    assert good in text
    (folder / "cartridge.yaml").write_text(text.replace(good, bad), encoding="utf-8")
    return folder


def problems_of(folder: Path) -> list[str]:
    with pytest.raises(CartridgeInvalid) as info:
        load_cartridge(folder)
    return info.value.problems


def test_an_unquoted_comma_is_one_problem_with_its_line_and_the_quoted_form(tmp_path: Path) -> None:
    """PyYAML reads `{description: A rentable unit, inside a property}` as {description: 'A rentable unit',
    'inside a property': null}. Before the fix: "entities.unit.inside a property: Extra inputs are not
    permitted", then nine lines of "'unit' is not an entity type". Now: one line, the file, line and column, and
    the value quoted; the entity type stays declared, so nothing else fails."""
    folder = slipped(tmp_path)
    file = folder / "cartridge.yaml"
    assert yaml.safe_load(file.read_text(encoding="utf-8"))["entities"]["unit"] == {
        "description": "A rentable unit", "inside a property": None}
    assert problems_of(folder) == [
        (f"{file}:line 7, column 40: 'inside a property' has no value: an unquoted comma inside {{…}} ended the "
         "value of description ('A rentable unit') there; quote a value that holds commas or colons: "
         'description: "A rentable unit, inside a property"')]


def test_a_colon_in_a_value_names_the_line_and_says_to_quote(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder = slipped(tmp_path, bad="{description: A rentable unit: inside a property}")
    [problem] = problems_of(folder)
    assert problem.startswith(f"{folder / 'cartridge.yaml'}:line 7, column 38: not valid YAML: expected ',' or '}}', "
                              "but got ':' (while parsing a flow mapping, from line 7, column 9)")
    assert "quote a value that holds colons or commas" in problem
    assert main(["validate", str(folder)]) == 2
    err = capsys.readouterr().err
    assert "line 7, column 38" in err and '<unicode string>' not in err


def test_a_broken_declaration_is_one_problem_not_a_cascade(tmp_path: Path) -> None:
    """Errors that follow from a broken entry are not reported as causes of their own: an entity type with an
    unknown key, a relation without its `to`, an event type without its `owner` each give one line (with its
    line number), and none of their users (relations, steps, `personal:`, rules) fails as well."""
    folder = slipped(tmp_path, bad="{description: A rentable unit, colour: red}")
    text = (folder / "cartridge.yaml").read_text(encoding="utf-8")
    text = text.replace("  unit_of: {from: unit, to: property}", "  unit_of: {from: unit}")
    text = text.replace("  renter.registered:\n    subject: renter\n    owner: leasing\n",
                        "  renter.registered:\n    subject: renter\n")
    (folder / "cartridge.yaml").write_text(text, encoding="utf-8")
    file = folder / "cartridge.yaml"
    assert problems_of(folder) == [
        f"{file}:line 7: entities.unit.colour: unknown key; this part takes description, ref",
        f"{file}:line 14: relations.unit_of.to: Field required",
        f"{file}:line 36: events.renter.registered.owner: Field required",
    ]


def test_an_independent_problem_is_still_reported_beside_a_slip(tmp_path: Path) -> None:
    folder = slipped(tmp_path)
    text = (folder / "cartridge.yaml").read_text(encoding="utf-8")
    (folder / "cartridge.yaml").write_text(text.replace("to: \"unit:{unit_id}\", at", "to: \"unit:{unitid}\", at"),
                                           encoding="utf-8")
    problems = problems_of(folder)
    assert len(problems) == 2 and "'inside a property' has no value" in problems[0]
    assert problems[1].endswith("events.lease.signed.project[1].link.to: {unitid}: not a payload field of this "
                                "event type")


# ---- the note mask after an erasure ----------------------------------------------------------------------

def test_after_an_erasure_notes_read_the_declared_mask(sealed: tuple[Path, Path, Path],
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """The cartridge declares `mask: "[withheld]"`: after `keel erase renter:r-001` the renter's fields, the
    request summary it wrote (of: payload.renter) and the notes on the renter all read "[withheld]" (notes read
    "[erased]" before the fix); the other renter's note is kept."""
    import keel as api
    folder, out, keys = sealed
    note = "Lucía asked to pay on the 5th"
    with api.open(folder, events=out, keys=keys) as graph:
        tools = graph.tools(tenant=TENANT, agent="a1")
        tools.annotate("renter:r-001", "payment_plan", note, "tenant", evidence="r-1")
        tools.annotate("renter:r-002", "payment_plan", "pays on the 1st", "tenant", evidence="r-2")
    assert main(["erase", str(folder), "--events", str(out), "--keys", str(keys), "--tenant", TENANT,
                 "--subject", "renter:r-001"]) == 0
    capsys.readouterr()
    with api.open(folder, events=out, keys=keys) as graph:
        tools = graph.tools(tenant=TENANT, agent="a1")
        renter = tools.context("renter:r-001")
        assert {k: renter["labels"][k] for k in ("name", "phone")} == {"name": "[withheld]", "phone": "[withheld]"}
        assert facts_of(graph, "renter:r-001")["payment_plan"] == "[withheld]"
        assert facts_of(graph, "renter:r-001")["email"] == "[withheld]"
        assert tools.context("request:mr-7")["labels"]["summary"] == "[withheld]"
        assert facts_of(graph, "renter:r-002")["payment_plan"] == "pays on the 1st"
        text = json.dumps(tools.history("renter:r-001"), ensure_ascii=False)
        assert note not in text and "[erased]" not in text
        assert all(value not in json.dumps(tools.context(e), ensure_ascii=False)
                   for value in PERSONAL_VALUES for e in ("renter:r-001", "request:mr-7"))


def test_a_cartridge_without_a_text_mask_for_the_type_keeps_the_default() -> None:
    """note_masks: the mask of the type's own events (of: subject), text only; else "[erased]"."""
    from keel.privacy import NOTE_MASK, note_masks
    cartridge = load_cartridge(FIXTURE)
    assert note_masks(cartridge) == {"renter": "[withheld]"}
    assert note_masks(cartridge).get("request", NOTE_MASK) == "[erased]"   # its mask is of: payload.renter's
