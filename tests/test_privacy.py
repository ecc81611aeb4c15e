"""Personal data (issue 24, embedded slice; docs/privacy.md): `personal:` in cartridge.yaml, field encryption
with a key per (tenant, data subject), `keel seal`, reads that decrypt, and `keel erase`."""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from keel.cartridge import load_cartridge
from keel.cli import main
from keel.errors import CartridgeInvalid

CARTRIDGE = """\
name: clinic
entities:
  client: {description: "A client; labels name and phone."}
  visit: {description: "A visit."}
relations:
  visit_of: {from: visit, to: client}
events:
  client.registered:
    subject: client
    owner: crm
    payload: {name: string, phone: string, channel: optional string, age: optional integer}
    project:
      - upsert: {labels: {name: "{name}", phone: "{phone}"}}
      - facts: {set: {acquired_via: "{channel}"}}
  visit.completed:
    subject: visit
    owner: pos
    payload: {client: string, remark: string, price: number}
    project:
      - upsert: {labels: {remark: "{remark}"}}
      - link: {relation: visit_of, to: "client:{client}"}
      - facts: {set: {price: "{price}"}}
"""

PERSONAL = """\
personal:
  client.registered:
    fields: [name, phone]
  visit.completed:
    fields: [remark]
    of: payload.client
    mask: "(erased)"
"""


def write_cartridge(folder: Path, personal: str = PERSONAL) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cartridge.yaml").write_text(CARTRIDGE + textwrap.dedent(personal), encoding="utf-8")
    return folder


def problems_of(folder: Path) -> list[str]:
    with pytest.raises(CartridgeInvalid) as e:
        load_cartridge(folder)
    return e.value.problems


def test_personal_section_loads_with_defaults(tmp_path: Path) -> None:
    c = load_cartridge(write_cartridge(tmp_path / "c"))
    reg = c.spec.personal["client.registered"]
    assert (reg.fields, reg.of, reg.mask, reg.subject_field()) == (["name", "phone"], "subject", "[erased]", None)
    visit = c.spec.personal["visit.completed"]
    assert (visit.of, visit.mask, visit.subject_field()) == ("payload.client", "(erased)", "client")


@pytest.mark.parametrize(("personal", "expected"), [
    ("personal:\n  client.left: {fields: [name]}\n", "personal.client.left: not an event type of the catalog"),
    ("personal:\n  client.registered: {fields: [name, email]}\n",
     "personal.client.registered.fields: 'email' is not a payload field of client.registered"),
    ("personal:\n  client.registered: {fields: [name], of: payload.nobody}\n",
     "personal.client.registered.of: 'nobody' is not a payload field of client.registered"),
    ("personal:\n  client.registered: {fields: [name], of: customer}\n",
     "personal.client.registered.of: 'customer'; use subject or payload.<field>"),
    ("personal:\n  visit.completed: {fields: [remark, client], of: payload.client}\n",
     "personal.visit.completed.of: payload.client is personal itself"),
    ("personal:\n  client.registered: {fields: [age]}\n",
     "personal.client.registered.mask: '[erased]' does not fit the type of payload.age (integer)"),
    ("personal:\n  client.registered: {fields: []}\n", "personal.client.registered.fields"),
    ("personal:\n  client.registered: {fields: [name], colour: red}\n", "personal.client.registered.colour"),
])
def test_validate_refuses_a_bad_personal_section(tmp_path: Path, personal: str, expected: str) -> None:
    problems = problems_of(write_cartridge(tmp_path / "c", personal))
    assert any(expected in p for p in problems), problems


def test_keel_validate_names_the_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_cartridge(tmp_path / "c", "personal:\n  client.registered: {fields: [email]}\n")
    assert main(["validate", str(folder)]) == 2
    assert "'email' is not a payload field of client.registered" in capsys.readouterr().err
    assert main(["validate", str(write_cartridge(tmp_path / "ok"))]) == 0


# ---- keel/privacy.py: field encryption and the key file ----------------------------------------------------

MASTER = bytes(range(32))
SECRET_NAME = "Zoë Quintana-Ávila"


def store_at(path: Path, master: bytes = MASTER):
    from keel.privacy import FileKeyStore
    return FileKeyStore(path, master)


def test_master_key_from_the_environment_or_a_file(tmp_path: Path) -> None:
    import base64

    from keel.errors import UsageError
    from keel.privacy import master_key
    text = base64.b64encode(MASTER).decode()
    assert master_key(env={"KEEL_MASTER_KEY": text}) == MASTER
    (tmp_path / "mk").write_text(text + "\n")
    assert master_key(env={"KEEL_MASTER_KEY_FILE": str(tmp_path / "mk")}) == MASTER
    for env, words in (({}, "no master key"), ({"KEEL_MASTER_KEY": "!!"}, "not base64"),
                       ({"KEEL_MASTER_KEY": base64.b64encode(b"short").decode()}, "5 bytes")):
        with pytest.raises(UsageError, match=words):
            master_key(env=env)


def test_a_field_round_trips_and_is_bound_to_tenant_subject_event_and_field(tmp_path: Path) -> None:
    from keel.privacy import decrypt_field, encrypt_field
    keys = store_at(tmp_path / "keys.json")
    kid, key = keys.key_for("t1", "client:c1")
    where = {"tenant": "t1", "subject": "client:c1", "event_id": "e1", "field": "name"}
    wire = encrypt_field(SECRET_NAME, key, kid, **where)
    assert set(wire) == {"keel.enc", "kid", "iv", "ct"} and wire["kid"] == kid
    assert SECRET_NAME not in str(wire)
    assert decrypt_field(wire, key, **where) == SECRET_NAME
    for moved in ({"tenant": "t2"}, {"subject": "client:c2"}, {"event_id": "e2"}, {"field": "phone"}):
        with pytest.raises(ValueError, match="does not verify") as e:
            decrypt_field(wire, key, **{**where, **moved})
        assert SECRET_NAME not in str(e.value)
    ct = bytearray(__import__("base64").b64decode(wire["ct"]))
    ct[0] ^= 1
    tampered = {**wire, "ct": __import__("base64").b64encode(bytes(ct)).decode()}
    with pytest.raises(ValueError, match="does not verify"):
        decrypt_field(tampered, key, **where)


def test_the_key_file_is_private_persistent_and_wrapped(tmp_path: Path) -> None:
    import base64
    import stat

    from keel.errors import UsageError
    path = tmp_path / "keys.json"
    keys = store_at(path)
    kid, key = keys.key_for("t1", "client:c1")
    assert keys.key_for("t1", "client:c1") == (kid, key)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    text = path.read_text()
    assert base64.b64encode(key).decode() not in text and key.hex() not in text     # only wrapped
    again = store_at(path)
    assert again.key(kid) == key and again.key_for("t1", "client:c1") == (kid, key)
    with pytest.raises(UsageError, match="another master key"):
        store_at(path, bytes(32))
    with pytest.raises(UsageError, match="not in key file"):
        again.key("0" * 32)
    assert again.erase("t1", "client:c1") == 1
    assert again.key(kid) is None and store_at(path).key(kid) is None     # erased: a mask, not an error
    assert again.erase("t1", "client:c1") == 0 and again.erasure("t1", "client:c1")["keys"] == 1
    new_kid, new_key = again.key_for("t1", "client:c1")
    assert new_kid != kid and new_key != key        # a new key after erasure cannot read what came before
    assert list(tmp_path.iterdir()) == [path]       # no temporary file left behind


def test_reveal_decrypts_masks_after_erasure_and_refuses_tampering(tmp_path: Path) -> None:
    from keel.errors import EnvelopeRejected
    from keel.privacy import Privacy
    privacy = Privacy(load_cartridge(write_cartridge(tmp_path / "c")), store_at(tmp_path / "keys.json"))
    clear = {"id": "e1", "tenant": "t1", "type": "client.registered", "subject": "client:c1",
             "occurred_at": "2026-01-01", "payload": {"name": SECRET_NAME, "phone": "+57 300 555 0101",
                                                      "channel": "web"}}
    sealed = privacy.seal(clear)
    assert sealed["payload"]["channel"] == "web" and SECRET_NAME not in str(sealed)
    assert privacy.reveal(sealed) == clear
    swapped = {**sealed, "payload": {**sealed["payload"], "name": sealed["payload"]["phone"]}}
    with pytest.raises(EnvelopeRejected, match="payload.name: encrypted value does not verify") as e:
        privacy.reveal(swapped)
    assert "+57" not in str(e.value) and e.value.event_id == "e1"
    with pytest.raises(EnvelopeRejected, match="does not verify"):
        privacy.reveal({**sealed, "id": "e2"})
    privacy.keys.erase("t1", "client:c1")
    masked = privacy.reveal(sealed)["payload"]
    assert masked == {"name": "[erased]", "phone": "[erased]", "channel": "web"}
