"""The `sources:` mapping (keel/sources.py): checked by `keel validate`, applied to Debezium change events by
`keel cdc explain` and the relay's encoder (keel/ingress/cdc.py). No services: hand-made Debezium records."""
from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from keel.cartridge import load_cartridge
from keel.errors import CartridgeInvalid
from keel.ingress.cdc import ChangeEncoder, ChangeRecord
from keel.ingress.cdc_decode import Skipped, Undecodable, decode_change
from keel.source_mapping import map_change
from keel.sources import Unmappable, compile_sources

ROOT = Path(__file__).resolve().parent.parent
HOUSEHOLD = ROOT / "examples" / "household"
CHANGES = HOUSEHOLD / "changes"


def change(table: str, op: str, before: dict | None, after: dict | None, *, lsn: int = 1000, commit: int = 900,
           tx: int = 7, ts_ms: int = 1788912000000, schema: bool = False) -> bytes:
    """A Debezium change event as the JSON converter writes it (schemas.enable=false unless `schema`)."""
    body = {"before": before, "after": after, "op": op, "ts_ms": ts_ms + 5, "transaction": None,
            "source": {"version": "3.6.1.Final", "connector": "postgresql", "name": "product", "ts_ms": ts_ms,
                       "snapshot": "true" if op == "r" else "false", "db": "product", "schema": "public",
                       "table": table, "txId": tx, "lsn": lsn, "sequence": json.dumps([str(commit), str(lsn)]),
                       "xmin": None}}
    if schema:
        body = {"schema": {"type": "struct", "fields": [], "optional": False, "name": "x.Envelope"}, "payload": body}
    return json.dumps(body).encode()


def debt(**over: object) -> dict:
    row = {"id": 1, "household_id": "hogar-demo", "creditor_id": "banco-andino", "account_id": "nomina",
           "debt_key": "visa", "product": "Visa", "month": 20697, "balance_cop": "4200000.00", "rate_ea_pct": "29.22",
           "installment_cop": "380000.00"}
    return {**row, **over}


def due(**over: object) -> dict:
    row = {"id": "visa-2026-09", "household_id": "hogar-demo", "debt_key": "visa", "due_on": 20701,
           "amount_cop": "380000.00", "status": "pending", "paid_on": None, "paid_cop": None, "account_id": None,
           "movement_id": None}
    return {**row, **over}


def movement(**over: object) -> dict:
    row = {"id": "mov-1", "household_id": "hogar-demo", "account_id": "nomina", "booked_on": 20706,
           "amount_cop": "-520000.00", "description": "PAGO"}
    return {**row, **over}


@pytest.fixture(scope="module")
def encoder() -> ChangeEncoder:
    return ChangeEncoder(load_cartridge(HOUSEHOLD), None)


def envelopes(encoder: ChangeEncoder, value: bytes) -> list[dict]:
    out, reason = encoder.explain(value)
    assert reason is None, reason
    return out


# ---- validate ---------------------------------------------------------------------------------------------

def test_the_household_sample_validates() -> None:
    cartridge = load_cartridge(HOUSEHOLD)
    sources, problems = compile_sources(cartridge.spec)
    assert problems == []
    assert sorted(s.spec.table for s in sources.values()) == ["public.debts", "public.dues", "public.movements"]


def broken(tmp_path: Path, edit) -> list[str]:
    folder = tmp_path / "c"
    folder.mkdir()
    doc = yaml.safe_load((HOUSEHOLD / "cartridge.yaml").read_text())
    edit(doc)
    (folder / "cartridge.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    with pytest.raises(CartridgeInvalid) as e:
        load_cartridge(folder)
    return e.value.problems


def test_validate_names_each_problem_of_a_mapping(tmp_path: Path) -> None:
    def edit(doc: dict) -> None:
        debts = doc["sources"]["debts"]["changes"][0]
        debts["type"] = "debt.snapshott"
        dues = doc["sources"]["dues"]["changes"]
        dues[0]["subject"] = "debt:{id}"                                  # not the subject type of due.scheduled
        dues[0]["payload"]["amount_cop"] = "{status}"                     # a string column into a number field
        del dues[1]["payload"]["account_id"]                              # a required field left out
        dues[2]["when"] = "before.status != 'paid' && after.colour == 'x'"   # not a declared column
        dues[1]["when"] = "after.status =="                               # does not compile
        moves = doc["sources"]["movements"]
        moves["changes"][0]["ops"] = ["read", "upsert"]
        moves["changes"][0]["payload"]["description"] = "{before.description}"   # no old row on read/insert
        moves["changes"][0]["payload"]["memo"] = "{description}"                  # not a payload field
        doc["sources"]["again"] = {**copy.deepcopy(moves), "changes": moves["changes"][1:]}
    problems = broken(tmp_path, edit)
    text = "\n".join(problems)
    assert "sources.debts.changes[0].type: 'debt.snapshott' is not an event type of the catalog" in text
    assert "sources.dues.changes[0].subject: 'debt:{id}' must start with \"due:\"" in text
    assert "sources.dues.changes[0].payload.amount_cop: gives a string value; payload.amount_cop of " \
           "due.scheduled is number" in text
    assert "sources.dues.changes[1].payload: account_id (string) of due.paid is required" in text
    assert "sources.dues.changes[2].when: after.colour is not a column of `columns:`" in text
    assert "sources.dues.changes[1].when: does not compile" in text
    assert "sources.movements.changes[0].ops: 'upsert': operations are read insert update delete" in text
    assert "{before.description}: read has no old row (only update and delete have one)" in text
    assert "sources.movements.changes[0].payload.memo: not a payload field of movement.imported" in text
    assert "public.movements is mapped by sources.again too" in text or \
           "public.movements is mapped by sources.movements too" in text


def test_keel_validate_reports_a_mapping_problem_with_exit_2(tmp_path: Path) -> None:
    folder = tmp_path / "c"
    folder.mkdir()
    text = (HOUSEHOLD / "cartridge.yaml").read_text().replace('subject: "debt:{debt_key}"',
                                                              'subject: "debt:{debt_name}"')
    (folder / "cartridge.yaml").write_text(text)
    proc = subprocess.run([sys.executable, "-m", "keel.cli", "validate", str(folder)], check=False,
                          capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 2
    assert "sources.debts.changes[0].subject: {debt_name}: 'debt_name' is not a column of `columns:`" in proc.stderr


# ---- mapping ----------------------------------------------------------------------------------------------

def test_an_insert_becomes_the_mapped_event_with_typed_values(encoder: ChangeEncoder) -> None:
    [event] = envelopes(encoder, change("debts", "c", None, debt()))
    assert event["type"] == "debt.snapshot" and event["subject"] == "debt:visa" and event["tenant"] == "hogar-demo"
    assert event["occurred_at"] == "2026-09-01T00:00:00Z"          # 20697 days after 1970-01-01
    assert event["recorded_at"] == "2026-09-09T00:00:00Z"          # the commit time (source.ts_ms)
    assert event["payload"] == {"creditor": "banco-andino", "product": "Visa", "balance_cop": 4200000,
                                "rate_ea_pct": 29.22, "installment_cop": 380000, "month": "2026-09-01"}


def test_embedded_schemas_or_not_give_the_same_envelope(encoder: ChangeEncoder) -> None:
    plain = envelopes(encoder, change("debts", "c", None, debt()))
    wrapped = envelopes(encoder, change("debts", "c", None, debt(), schema=True))
    assert plain == wrapped


def test_an_update_maps_only_when_its_condition_holds(encoder: ChangeEncoder) -> None:
    paid = due(status="paid", paid_on=20705, paid_cop="380000.00", account_id="nomina", movement_id="mov-9")
    [event] = envelopes(encoder, change("dues", "u", due(), paid))
    assert event["type"] == "due.paid" and event["occurred_at"] == "2026-09-09T00:00:00Z"
    assert event["payload"] == {"paid_on": "2026-09-09", "amount_cop": 380000, "account_id": "nomina",
                                "movement_id": "mov-9"}
    out, reason = encoder.explain(change("dues", "u", paid, {**paid, "movement_id": "mov-10"}))
    assert out == [] and reason == "maps to nothing: sources.dues: update of public.dues: no entry's condition " \
                                   "holds for this change"


def test_a_snapshot_read_of_a_paid_due_gives_both_of_its_events(encoder: ChangeEncoder) -> None:
    paid = due(status="paid", paid_on=20705, paid_cop="380000.00", account_id="nomina", movement_id="mov-9")
    assert [e["type"] for e in envelopes(encoder, change("dues", "r", None, paid))] == ["due.scheduled", "due.paid"]


def test_ids_follow_the_position_so_a_change_read_twice_is_the_same_envelope(encoder: ChangeEncoder) -> None:
    update = change("debts", "u", debt(), debt(balance_cop="4100000.00"), lsn=5000, commit=4900)
    assert envelopes(encoder, update) == envelopes(encoder, update)
    later = change("debts", "u", debt(), debt(balance_cop="4100000.00"), lsn=7000, commit=6900)
    assert envelopes(encoder, update)[0]["id"] != envelopes(encoder, later)[0]["id"]


def test_a_resnapshot_of_an_inserted_row_is_the_same_envelope(encoder: ChangeEncoder) -> None:
    inserted = envelopes(encoder, change("debts", "c", None, debt(), lsn=1000, ts_ms=1788912000000))
    read = envelopes(encoder, change("debts", "r", None, debt(), lsn=99000, ts_ms=1790000000000))
    assert [e["id"] for e in inserted] == [e["id"] for e in read]
    strip = [{k: v for k, v in e.items() if k != "recorded_at"} for e in inserted]
    assert strip == [{k: v for k, v in e.items() if k != "recorded_at"} for e in read]


def test_a_delete_retracts_the_event_of_the_rows_inserted_state(encoder: ChangeEncoder) -> None:
    [imported] = envelopes(encoder, change("movements", "c", None, movement()))
    [retraction] = envelopes(encoder, change("movements", "d", movement(), None, lsn=3000))
    assert retraction["type"] == "keel.retracted" and retraction["subject"] == "movement:mov-1"
    assert retraction["payload"]["event"] == imported["id"]


def test_a_change_that_cannot_map_names_the_column_never_its_value(encoder: ChangeEncoder) -> None:
    out, reason = encoder.explain(change("debts", "c", None, debt(balance_cop="lots-of-money")))
    assert out == [] and reason.startswith("cannot map: sources.debts: column balance_cop: a text")
    assert "lots-of-money" not in reason
    missing = debt()
    del missing["product"]
    out, reason = encoder.explain(change("debts", "c", None, missing))
    assert reason == "cannot map: sources.debts: column product is missing from the after row (a schema change?)"


def test_a_column_added_mid_stream_is_ignored_until_mapped(encoder: ChangeEncoder) -> None:
    plain = envelopes(encoder, change("debts", "c", None, debt()))
    wider = envelopes(encoder, change("debts", "c", None, debt(note="added by ALTER TABLE")))
    assert plain == wider


def test_what_maps_to_nothing_says_why(encoder: ChangeEncoder) -> None:
    assert encoder.explain(None) == ([], "maps to nothing: a tombstone (null value)")
    out, reason = encoder.explain(change("payments", "c", None, {"id": 1}))
    assert out == [] and reason.startswith("maps to nothing: the cartridge maps no table public.payments")
    out, reason = encoder.explain(change("debts", "d", debt(), None))
    assert reason == "maps to nothing: sources.debts: delete of public.debts: no entry of the mapping takes this " \
                     "operation"
    assert isinstance(decode_change(b'{"op": "t", "source": {}}'), Skipped)
    with pytest.raises(Undecodable):
        decode_change(b'{"op": "x"}')
    with pytest.raises(Undecodable):
        decode_change(b"not json")


def test_the_relay_encoder_dead_letters_with_the_position_and_no_row_values(encoder: ChangeEncoder) -> None:
    bad = change("debts", "c", None, debt(balance_cop="secret-amount"), lsn=4242, tx=99)
    good = change("debts", "c", None, debt())
    out = encoder.encode([ChangeRecord("product.public.debts", 3, 17, bad), ChangeRecord("t", 0, 1, good),
                          ChangeRecord("t", 0, 2, None)])
    assert (out.relayed, out.dead, out.unmapped) == (1, 1, 1)
    letter = next(r for r in out.records if r.topic == encoder.dlq)
    headers = dict(letter.headers)
    assert letter.value == b""
    assert headers["keel.source"] == b"cdc" and headers["keel.source.lsn"] == b"4242"
    assert headers["keel.source.tx_id"] == b"99" and headers["keel.source.offset"] == b"17"
    assert headers["keel.source.table"] == b"public.debts"
    assert b"secret-amount" not in b"".join(v for _, v in letter.headers)


def test_mapping_raises_unmappable_for_a_null_subject_column() -> None:
    cartridge = load_cartridge(HOUSEHOLD)
    sources, _ = compile_sources(cartridge.spec)
    decoded = decode_change(change("debts", "c", None, debt(debt_key=None)))
    with pytest.raises(Unmappable, match="subject: column debt_key is null"):
        map_change(sources["debts"], decoded)


# ---- keel cdc explain -------------------------------------------------------------------------------------

def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "keel.cli", *args], check=False, capture_output=True, cwd=ROOT,
                          input=stdin)


def test_keel_cdc_explain_prints_the_envelope_of_the_sample_change() -> None:
    proc = run("cdc", "explain", str(HOUSEHOLD), str(CHANGES / "due-paid.json"))
    assert proc.returncode == 0, proc.stderr
    [line] = proc.stdout.decode().splitlines()
    event = json.loads(line)
    assert event["type"] == "due.paid" and event["subject"] == "due:libranza-2026-09"
    assert event["payload"]["amount_cop"] == 520000


def test_keel_cdc_explain_exit_codes() -> None:
    proc = run("cdc", "explain", str(HOUSEHOLD), "-", stdin=change("debts", "c", None, debt(month="soon")))
    assert proc.returncode == 1 and proc.stdout == b""
    assert b"cannot map: sources.debts: column month: a text" in proc.stderr
    proc = run("cdc", "explain", str(HOUSEHOLD), "-", stdin=b"null")
    assert proc.returncode == 0 and b"maps to nothing: a tombstone" in proc.stderr
    proc = run("cdc", "explain", str(HOUSEHOLD), "/nonexistent.json")
    assert proc.returncode == 2 and b"/nonexistent.json: cannot be read" in proc.stderr
    proc = run("cdc", "explain", str(ROOT / "cartridges" / "finance"), str(CHANGES / "due-paid.json"))
    assert proc.returncode == 2 and b"has no `sources:`" in proc.stderr


# ---- personal fields ------------------------------------------------------------------------------------

def test_personal_fields_are_sealed_at_the_relay_and_never_in_a_dead_letter(tmp_path: Path) -> None:
    from test_privacy import plaintext_forms, store_at

    from keel.ingress.sealing import IngressSealing
    from keel.privacy import Privacy, is_encrypted

    folder = tmp_path / "household"
    folder.mkdir()
    text = (HOUSEHOLD / "cartridge.yaml").read_text()
    (folder / "cartridge.yaml").write_text(text + "\npersonal:\n  movement.imported: {fields: [description]}\n")
    cartridge = load_cartridge(folder)
    encoder = ChangeEncoder(cartridge, None, IngressSealing(Privacy(cartridge, store_at(tmp_path / "keys.json"))))
    name = "Zoë Quintana-Ávila"
    row = {"id": "mov-7", "household_id": "hogar-demo", "account_id": "nomina", "booked_on": 20706,
           "amount_cop": "-52000.00", "description": f"PAGO A {name}"}
    bad = {**row, "id": "mov-8", "amount_cop": "much"}
    out = encoder.encode([ChangeRecord("p.public.movements", 0, 1, change("movements", "c", None, row)),
                          ChangeRecord("p.public.movements", 0, 2, change("movements", "c", None, bad))])
    assert (out.relayed, out.dead) == (1, 1)
    event, letter = out.records
    assert is_encrypted(json.loads(event.value)["payload"]["description"])
    for record in (event, letter):
        data = (record.value or b"") + b"".join(v for _, v in record.headers)
        for form in plaintext_forms(name):
            assert form not in data


def test_a_delete_maps_to_the_event_type_the_cartridge_names(tmp_path: Path) -> None:
    doc = yaml.safe_load((HOUSEHOLD / "cartridge.yaml").read_text())
    doc["events"]["debt.snapshot_removed"] = {
        "subject": "debt", "owner": "debts", "payload": {"month": "string"},
        "project": [{"close": {"facts": ["balance_cop", "rate_ea_pct", "installment_cop"]}}]}
    doc["sources"]["debts"]["changes"].append({
        "ops": ["delete"], "type": "debt.snapshot_removed", "subject": "debt:{debt_key}", "occurred_at": "{month}",
        "payload": {"month": "{before.month:date}"}})
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "cartridge.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    encoder = ChangeEncoder(load_cartridge(folder), None)
    [event] = envelopes(encoder, change("debts", "d", debt(), None, lsn=8800))
    assert event["type"] == "debt.snapshot_removed" and event["subject"] == "debt:visa"
    assert event["occurred_at"] == "2026-09-01T00:00:00Z" and event["payload"] == {"month": "2026-09-01"}
    assert event["id"] != envelopes(encoder, change("debts", "d", debt(), None, lsn=9900))[0]["id"]


def test_a_dead_letters_reason_quotes_no_value(tmp_path: Path) -> None:
    doc = yaml.safe_load((HOUSEHOLD / "cartridge.yaml").read_text())
    doc["sources"]["debts"]["changes"][0]["when"] = "after.product > 3"     # a string compared with a number
    folder = tmp_path / "c"
    folder.mkdir()
    (folder / "cartridge.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    encoder = ChangeEncoder(load_cartridge(folder), None)
    value = change("debts", "c", None, debt(product="Secret Product"))
    [letter] = encoder.encode([ChangeRecord("t", 0, 5, value)]).records
    reason = dict(letter.headers)["keel.reason"].decode()
    assert reason.startswith("sources.debts: changes[0].when could not be evaluated (")
    assert "Secret" not in reason
    bad_subject = debt(debt_key="Ana Ruiz")            # not an id: the catalog refuses the subject, quoting it
    encoder = ChangeEncoder(load_cartridge(HOUSEHOLD), None)
    [letter] = encoder.encode([ChangeRecord("t", 0, 6, change("debts", "c", None, bad_subject))]).records
    reason = dict(letter.headers)["keel.reason"].decode()
    assert reason.startswith("sources.debts: the envelope is refused: subject: '…' is not allowed")
    assert "Ana" not in reason
    _, explained = encoder.explain(change("debts", "c", None, bad_subject))
    assert "Ana Ruiz" in explained                    # the author's own tool shows the whole reason
