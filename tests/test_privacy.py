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
      - link: {relation: visit_of, to: "{client}"}
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

ACCEPT_CLEAR = "  accept_clear: true\n"     # `personal: {accept_clear: true}`, appended to PERSONAL


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
    from keel.keystore import FileKeyStore
    return FileKeyStore(path, master)


def test_master_key_from_the_environment_or_a_file(tmp_path: Path) -> None:
    import base64

    from keel.errors import UsageError
    from keel.keystore import master_key
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


# ---- keel seal, and reads of a sealed file ----------------------------------------------------------------

def envelope(n: int, tenant: str, kind: str, subject: str, payload: dict) -> dict:
    return {"id": f"e{n}", "tenant": tenant, "type": kind, "subject": subject,
            "occurred_at": f"2026-01-{n:02d}T10:00:00Z", "payload": payload}


STREAM = [
    envelope(1, "t1", "client.registered", "client:c1", {"name": SECRET_NAME, "phone": "+57 300 555 0101",
                                                         "channel": "web"}),
    envelope(2, "t1", "client.registered", "client:c2", {"name": "Ana Ruiz", "phone": "+57 300 555 0202"}),
    envelope(3, "t1", "visit.completed", "visit:v1", {"client": "client:c1", "remark": "alérgica al látex",
                                                      "price": 40}),
    envelope(4, "t1", "client.registered", "client:c1", {"name": SECRET_NAME + " (2)", "phone": "+57 300 555 0103"}),
    envelope(5, "t1", "visit.completed", "visit:v2", {"client": "client:c2", "remark": "prefiere la mañana",
                                                      "price": 25}),
    envelope(6, "t2", "client.registered", "client:c1", {"name": "Other Tenant", "phone": "+1 555 0100"}),
]


def write_lines(path: Path, envelopes: list[dict]) -> Path:
    import json
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in envelopes), encoding="utf-8")
    return path


def masked(envelopes: list[dict], tenant: str, subject: str, cartridge: Path) -> list[dict]:
    """The stream as it would read with `subject`'s personal fields replaced by the mask (in clear)."""
    spec = load_cartridge(cartridge).spec.personal
    out = []
    for e in envelopes:
        p = spec.get(e["type"])
        whose = e["subject"] if p is None or p.subject_field() is None else e["payload"][p.subject_field()]
        if p is not None and e["tenant"] == tenant and whose == subject:
            e = {**e, "payload": {k: (p.mask if k in p.fields else v) for k, v in e["payload"].items()}}
        out.append(e)
    return out


def digests(cartridge: Path, events: Path, keys: Path | None = None) -> dict[str, str]:
    """{tenant: digest} of a sealed file read with its keys; without `keys`, of a file in clear built as the
    reference (without the privacy step, which refuses personal fields in clear)."""
    import keel
    from keel.digest import digest
    if keys is None:
        from support.workers import embedded_digests
        return embedded_digests(load_cartridge(cartridge), events)
    with keel.open(cartridge, events=events, keys=keys) as graph:
        return {t: digest(graph.store, t) for t in graph.tenants}


@pytest.fixture
def master(monkeypatch: pytest.MonkeyPatch) -> None:
    import base64
    monkeypatch.setenv("KEEL_MASTER_KEY", base64.b64encode(MASTER).decode())
    monkeypatch.delenv("KEEL_MASTER_KEY_FILE", raising=False)


@pytest.fixture
def sealed(tmp_path: Path, master: None, capsys: pytest.CaptureFixture[str]) -> tuple[Path, Path, Path, Path]:
    """(cartridge, clear file, sealed file, key file)"""
    folder = write_cartridge(tmp_path / "c")
    clear, out, keys = write_lines(tmp_path / "clear.jsonl", STREAM), tmp_path / "sealed.jsonl", tmp_path / "k.json"
    assert main(["seal", str(folder), str(clear), str(out), "--keys", str(keys)]) == 0
    assert "6 lines, 6 sealed, 0 refused" in capsys.readouterr().out
    return folder, clear, out, keys


def test_seal_encrypts_every_personal_field(sealed: tuple[Path, Path, Path, Path]) -> None:
    import json
    _, _, out, keys = sealed
    text = out.read_text(encoding="utf-8")
    for e in STREAM:
        for value in e["payload"].values():
            if isinstance(value, str) and value not in ("web",) and not value.startswith("client:"):
                assert value not in text and json.dumps(value) not in text
    lines = [json.loads(x) for x in text.splitlines()]
    assert lines[0]["payload"]["channel"] == "web" and lines[0]["payload"]["name"]["keel.enc"] == "v1"
    assert lines[2]["payload"]["client"] == "client:c1" and lines[2]["payload"]["price"] == 40
    assert len(json.loads(keys.read_text())["keys"]) == 3       # (t1, client:c1), (t1, client:c2), (t2, client:c1)


def test_a_sealed_file_builds_the_clear_file_graph(sealed: tuple[Path, Path, Path, Path]) -> None:
    folder, clear, out, keys = sealed
    assert digests(folder, out, keys) == digests(folder, clear)


def test_a_shredded_key_reads_as_the_mask(sealed: tuple[Path, Path, Path, Path], tmp_path: Path) -> None:
    from keel.keystore import open_key_file
    folder, clear, out, keys = sealed
    assert open_key_file(keys).erase("t1", "client:c1") == 1
    expected = digests(folder, write_lines(tmp_path / "masked.jsonl", masked(STREAM, "t1", "client:c1", folder)))
    got = digests(folder, out, keys)
    assert got == expected
    assert got["t2"] == digests(folder, clear)["t2"] and got["t1"] != digests(folder, clear)["t1"]


def test_keel_context_reads_a_sealed_file_with_its_keys(sealed: tuple[Path, Path, Path, Path],
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import json
    folder, clear, out, keys = sealed
    assert main(["context", str(folder), str(out), "client:c1", "--tenant", "t1", "--keys", str(keys),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"]["name"] == SECRET_NAME + " (2)"
    assert main(["digest", str(folder), str(out), "--tenant", "t2", "--keys", str(keys)]) == 0
    assert capsys.readouterr().out.strip() == digests(folder, clear)["t2"]
    assert main(["digest", str(folder), str(out), "--tenant", "t1", "--keys", str(out.parent / "none.json")]) == 2
    assert "key file" in capsys.readouterr().err


def test_seal_refuses_a_line_that_is_not_json_without_showing_it(tmp_path: Path, master: None,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_cartridge(tmp_path / "c")
    clear = write_lines(tmp_path / "clear.jsonl", STREAM[:1])
    with clear.open("a") as f:
        f.write('{"name": "' + SECRET_NAME + '"\n')
    assert main(["seal", str(folder), str(clear), str(tmp_path / "out.jsonl"), "--keys", str(tmp_path / "k")]) == 2
    err = capsys.readouterr().err
    assert "line 2: refused" in err and SECRET_NAME not in err
    assert SECRET_NAME not in (tmp_path / "out.jsonl").read_text(encoding="utf-8")


# ---- keel erase -------------------------------------------------------------------------------------------

def plaintext_forms(value: str) -> list[bytes]:
    """A value as written, JSON-escaped (ASCII escapes too) and in base64."""
    import base64
    import json
    raw = value.encode()
    return [raw, json.dumps(value).encode(), json.dumps(value, ensure_ascii=False).encode(),
            base64.b64encode(raw), base64.urlsafe_b64encode(raw)]


def test_erase_shreds_a_subject_everywhere_once(sealed: tuple[Path, Path, Path, Path], tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import keel
    folder, _, out, keys = sealed
    before = digests(folder, out, keys)
    with keel.open(folder, events=out, keys=keys) as graph:
        assert graph.tools(tenant="t1").context("client:c1")["labels"]["name"] == SECRET_NAME + " (2)"
    erase = ["erase", str(folder), "--events", str(out), "--keys", str(keys), "--tenant", "t1",
             "--subject", "client:c1", "--reason", "request 2026-117 (Ley 1581)"]
    assert main(erase) == 0
    first = capsys.readouterr().out
    assert "client:c1 of tenant t1: erased (1 key deleted)" in first
    receipt = json.loads(out.read_text(encoding="utf-8").splitlines()[-1])
    assert receipt["type"] == "keel.erased" and receipt["subject"] == "client:c1" and receipt["tenant"] == "t1"
    assert receipt["payload"] == {"keys": 1, "reason": "request 2026-117 (Ley 1581)"}

    assert main(erase) == 0                                   # idempotent: said, not done again
    assert "already erased at" in capsys.readouterr().out
    assert out.read_text(encoding="utf-8").count("keel.erased") == 1

    with keel.open(folder, events=out, keys=keys) as graph:
        tools = graph.tools(tenant="t1")
        assert tools.context("client:c1")["labels"]["name"] == "[erased]"
        assert tools.context("client:c1")["labels"]["phone"] == "[erased]"
        assert tools.context("visit:v1")["labels"]["remark"] == "(erased)"
        assert tools.context("client:c2")["labels"]["name"] == "Ana Ruiz"            # others unchanged
        history = json.dumps(tools.history("client:c1"), ensure_ascii=False)
        assert SECRET_NAME not in history and "300 555 01" not in history
        assert graph.tools(tenant="t2").context("client:c1")["labels"]["name"] == "Other Tenant"
    # the graph equals the clear stream with c1's fields masked, plus the receipt
    expected = write_lines(tmp_path / "expected.jsonl", [*masked(STREAM, "t1", "client:c1", folder), receipt])
    after = digests(folder, out, keys)
    assert after == digests(folder, expected) and after["t2"] == before["t2"]

    stored = out.read_bytes() + keys.read_bytes()
    erased_values = [SECRET_NAME, SECRET_NAME + " (2)", "+57 300 555 0101", "+57 300 555 0103", "alérgica al látex"]
    for value in erased_values:
        for form in plaintext_forms(value):
            assert form not in stored, value
    assert main(["erase", str(folder), "--events", str(out), "--keys", str(keys), "--tenant", "t1",
                 "--subject", "client:c9"]) == 1
    assert "never held a key of client:c9" in capsys.readouterr().err


def test_erase_refuses_bad_arguments_before_changing_anything(sealed: tuple[Path, Path, Path, Path],
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    folder, _, out, keys = sealed
    text = keys.read_text()
    for extra in (["--tenant", "t1", "--subject", "c1"], ["--tenant", "t 1", "--subject", "client:c1"]):
        assert main(["erase", str(folder), "--events", str(out), "--keys", str(keys), *extra]) == 2
    assert main(["erase", str(folder), "--events", str(out.parent / "missing.jsonl"), "--keys", str(keys),
                 "--tenant", "t1", "--subject", "client:c1"]) == 2
    assert keys.read_text() == text


def test_a_sealed_file_read_without_keys_says_so(sealed: tuple[Path, Path, Path, Path],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    folder, _, out, _ = sealed
    assert main(["digest", str(folder), str(out), "--tenant", "t1"]) == 1     # every t1 line refused: no tenant
    err = capsys.readouterr().err
    assert "line 1: event e1: payload.name: encrypted personal data; give the key file (--keys FILE" in err


def test_the_documented_wire_form_is_what_a_producer_in_another_language_writes() -> None:
    """docs/privacy.md: built by hand from the documented bytes, with AESGCM only, the field decrypts."""
    import base64

    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    from keel.privacy import decrypt_field
    key, iv = bytes(range(32, 64)), bytes(range(12))
    ad = bytes.fromhex("6b65656c2e656e632f7631" "00000002" "7431" "00000009" "636c69656e743a6331" "00000002" "6531"
                       "00000004" "6e616d65")
    ct = AESGCM(key).encrypt(iv, '"Zoë"'.encode(), ad)
    wire = {"keel.enc": "v1", "kid": "k1", "iv": base64.b64encode(iv).decode(), "ct": base64.b64encode(ct).decode()}
    assert decrypt_field(wire, key, tenant="t1", subject="client:c1", event_id="e1", field="name") == "Zoë"


def test_a_refused_personal_field_is_never_shown(tmp_path: Path, master: None,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """A personal value of the wrong type, in clear or sealed, is refused by name and type, never by value."""
    folder = write_cartridge(tmp_path / "c")
    bad = [envelope(1, "t1", "client.registered", "client:c1", {"name": 31415926, "phone": "+57 300 555 0101"}),
           envelope(2, "t1", "client.registered", "client:c2", {"name": "Ana", "phone": "+57 300 555 0202",
                                                                "channel": 27182818})]
    clear = write_lines(tmp_path / "clear.jsonl", bad)
    sealed, keys = tmp_path / "sealed.jsonl", tmp_path / "k.json"
    assert main(["seal", str(folder), str(clear), str(sealed), "--keys", str(keys)]) == 0
    accepting = write_cartridge(tmp_path / "accepting", PERSONAL + ACCEPT_CLEAR)
    for cartridge, events, extra in ((accepting, clear, []), (folder, sealed, ["--keys", str(keys)])):
        capsys.readouterr()
        main(["digest", str(cartridge), str(events), "--tenant", "t1", *extra])
        err = capsys.readouterr().err
        assert "payload.name: expected string, got a value of type int (personal data, not shown)" in err
        assert "31415926" not in err
        assert "payload.channel: expected string, got 27182818" in err       # not personal: shown as before


def test_validate_and_diff_read_a_sealed_log_with_its_keys(sealed: tuple[Path, Path, Path, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    folder, _, out, keys = sealed
    assert main(["validate", str(folder), "--events", str(out), "--keys", str(keys)]) == 0
    assert "6 events ok" in capsys.readouterr().out
    assert main(["validate", str(folder), "--events", str(out)]) == 2
    assert "payload.name: encrypted personal data; give the key file" in capsys.readouterr().err
    assert main(["diff", str(folder), str(folder), str(out), "--keys", str(keys)]) == 0


def test_an_audited_answer_replayed_after_an_erasure_names_it(sealed: tuple[Path, Path, Path, Path], tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 26: `keel audit replay` reproduces an answer byte for byte unless an erasure intervened, and then it
    says so (naming the receipts, never the erased subject)."""
    import json

    import keel
    from keel.audit import AuditFile, finish, new_record
    folder, _, out, keys = sealed
    with keel.open(folder, events=out, keys=keys) as graph:
        result = graph.tools(tenant="t1").context("client:c1", at="2026-06-01T00:00:00Z")
    assert result["labels"]["name"] == SECRET_NAME + " (2)"
    record = new_record(cartridge=load_cartridge(folder).name, tool="context", tenant="t1", agent=None, task=None,
                        subject=None, arguments={"entity": "client:c1"}, at="2026-06-01T00:00:00Z")
    log = tmp_path / "audit.jsonl"
    AuditFile(log).write(finish(record, outcome="ok", result=result, sent=json.dumps(result).encode()))
    replay = ["audit", "replay", record["id"], str(folder), str(out), "--keys", str(keys), "--audit", str(log),
              "--entity", "client:c1", "--json"]
    assert main(replay) == 0 and json.loads(capsys.readouterr().out)["identical"] is True
    assert main(["erase", str(folder), "--events", str(out), "--keys", str(keys), "--tenant", "t1",
                 "--subject", "client:c1"]) == 0
    capsys.readouterr()
    assert main(replay) == 1
    verdict = json.loads(capsys.readouterr().out)
    assert verdict["identical"] is False and verdict["why"].startswith("erasure intervened")
    assert len(verdict["erasures"]) == 1 and "client:c1" not in json.dumps(verdict)


def test_personal_fields_in_clear_are_refused_unless_the_cartridge_accepts_them(
        tmp_path: Path, master: None, capsys: pytest.CaptureFixture[str]) -> None:
    """A clear personal field is refused by name (never by value) on every read of an events file; the
    cartridge's `personal: {accept_clear: true}` accepts it (a migration window): the graph then equals the
    reference build of the clear file."""
    import json
    folder = write_cartridge(tmp_path / "c")
    clear = write_lines(tmp_path / "clear.jsonl", STREAM)
    assert main(["digest", str(folder), str(clear), "--tenant", "t2"]) == 1       # its only line was refused
    err = capsys.readouterr().err
    assert "line 6: event e6: payload.name, payload.phone: personal data in clear (not shown)" in err
    assert "line 3: event e3: payload.remark: personal data in clear" in err
    assert all(form.decode() not in err for v in ("Other Tenant", SECRET_NAME, "alérgica al látex")
               for form in plaintext_forms(v)[:3])
    accepting = write_cartridge(tmp_path / "accepting", PERSONAL + ACCEPT_CLEAR)
    assert load_cartridge(accepting).spec.personal_accept_clear is True
    assert set(load_cartridge(accepting).spec.personal) == {"client.registered", "visit.completed"}
    assert main(["validate", str(accepting)]) == 0
    capsys.readouterr()
    assert main(["context", str(accepting), str(clear), "client:c1", "--tenant", "t1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["labels"]["name"] == SECRET_NAME + " (2)"
    # sealed lines are read with the keys either way
    sealed, keys = tmp_path / "sealed.jsonl", tmp_path / "k.json"
    assert main(["seal", str(folder), str(clear), str(sealed), "--keys", str(keys)]) == 0
    assert digests(accepting, sealed, keys) == digests(folder, sealed, keys) == digests(folder, clear)


@pytest.mark.parametrize(("option", "expected"), [
    ("  accept_clear: yes please\n", "personal.accept_clear: 'yes please'; use true or false"),
    ("  accept_clear: 1\n", "personal.accept_clear: 1; use true or false"),
])
def test_validate_refuses_a_bad_accept_clear(tmp_path: Path, option: str, expected: str) -> None:
    problems = problems_of(write_cartridge(tmp_path / "c", PERSONAL + option))
    assert any(expected in p for p in problems), problems


def test_a_clear_record_is_refused_with_its_personal_fields_masked(tmp_path: Path) -> None:
    """The worker's judge refuses a record whose personal fields are in clear; what its dead letter keeps is
    the envelope with those fields masked (never the clear values); an escaped type name does not hide it."""
    import json

    from keel.keystore import FileKeyStore
    from keel.privacy import Privacy
    from keel.projector import Projector
    from workers.judge import judge
    from workers.mirror import RecordingStore
    from workers.records import Record
    cartridge = load_cartridge(write_cartridge(tmp_path / "c"))
    privacy = Privacy(cartridge, FileKeyStore(tmp_path / "k.json", MASTER))
    for value in (json.dumps(STREAM[0], ensure_ascii=False).encode(),
                  json.dumps(STREAM[0]).replace("client.registered", "client\\u002eregistered").encode()):
        recorder = RecordingStore()
        verdict = judge(Projector(cartridge, recorder), recorder, Record("keel.c.events", 0, 0, None, b"t1", value),
                        reveal=privacy.reveal_line)
        assert verdict.outcome == "refused" and verdict.tenant == "t1" and verdict.event_id == "e1"
        assert verdict.reason.startswith("payload.name, payload.phone: personal data in clear (not shown)")
        assert verdict.kept is not None
        kept = json.loads(verdict.kept)
        assert kept["payload"] == {"name": "[erased]", "phone": "[erased]", "channel": "web"}
        for secret in (SECRET_NAME, "+57 300 555 0101"):
            assert all(f not in verdict.kept and f.decode() not in verdict.reason for f in plaintext_forms(secret))
    sealed = json.dumps(privacy.seal(STREAM[0])).encode()
    recorder = RecordingStore()
    assert judge(Projector(cartridge, recorder), recorder, Record("keel.c.events", 0, 0, None, b"t1", sealed),
                 reveal=privacy.reveal_line).outcome == "applied"


def test_erase_masks_the_notes_on_the_subject_and_says_when(sealed: tuple[Path, Path, Path, Path],
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    """Notes (annotate) on the erased data subject's entity, written before the erasure, read as the mask in
    every version; notes on other entities and notes written after it are kept; context and history carry the
    `keel.erased` fact from the erasure's time (the receipt's id)."""
    import json

    import keel

    def fact(context: dict, predicate: str) -> object:
        [value] = [f["value"] for f in context["facts"] if f["predicate"] == predicate]
        return value
    folder, _, out, keys = sealed
    note = "llamó desde el +57 300 555 0101"
    with keel.open(folder, events=out, keys=keys) as graph:
        tools = graph.tools(tenant="t1", agent="a1")
        tools.annotate("client:c1", "call", note, "tenant", evidence="e1")
        tools.annotate("client:c1", "mine", "prefers mornings", "agent")
        tools.annotate("client:c2", "call", "called back", "tenant", evidence="e2")
        assert fact(tools.context("client:c1"), "call") == note
    assert main(["erase", str(folder), "--events", str(out), "--keys", str(keys), "--tenant", "t1",
                 "--subject", "client:c1"]) == 0
    receipt = json.loads(out.read_text(encoding="utf-8").splitlines()[-1])
    capsys.readouterr()
    with keel.open(folder, events=out, keys=keys) as graph:
        tools = graph.tools(tenant="t1", agent="a1")
        context = tools.context("client:c1")
        assert fact(context, "call") == "[erased]" and fact(context, "mine") == "[erased]"
        assert fact(context, "keel.erased") == {"receipt": receipt["id"], "keys": 1}
        assert fact(tools.context("client:c2"), "call") == "called back"
        history = tools.history("client:c1")
        text = json.dumps(history, ensure_ascii=False)
        assert note not in text and "prefers mornings" not in text
        [erased] = [v for v in history["versions"] if v["predicate"] == "keel.erased"]
        assert erased["valid_from"] == receipt["occurred_at"] and erased["evidence"] == receipt["id"]
        tools.annotate("client:c1", "later", "a note after the erasure", "agent")
    with keel.open(folder, events=out, keys=keys) as graph:
        assert fact(graph.tools(tenant="t1", agent="a1").context("client:c1"), "later") == "a note after the erasure"


# ---- --clear: a personal cartridge's own clear sample, one run ---------------------------------------------

CLEAR_WARNING = ("keel: warning: --clear: personal fields of 'clinic' are read in clear for this run only; nothing "
                 "of them is sealed or erasable: seal the file (`keel seal`) before it holds real people's data "
                 "(docs/privacy.md)")


def test_the_documented_seal_check_digest_clear_in_equals_digest_out_with_its_keys(
        sealed: tuple[Path, Path, Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 40: docs/privacy.md said to check `keel seal` by `keel digest` of IN and OUT; IN is in clear, so the
    cartridge refused its personal lines and the digests differed. `keel digest --clear IN` reads IN as it is."""
    folder, clear, out, keys = sealed
    for tenant in ("t1", "t2"):
        assert main(["digest", str(folder), str(clear), "--tenant", tenant]) == 1      # refused: no event of it
        assert "personal data in clear (not shown)" in capsys.readouterr().err
        assert main(["digest", str(folder), str(clear), "--tenant", tenant, "--clear"]) == 0
        got = capsys.readouterr()
        assert got.err.splitlines() == [CLEAR_WARNING]                               # one line, no value
        assert main(["digest", str(folder), str(out), "--tenant", tenant, "--keys", str(keys)]) == 0
        assert capsys.readouterr().out == got.out and got.out.startswith("sha256:")
        assert got.out.strip() == digests(folder, clear)[tenant]                     # the reference build


def test_clear_reads_the_sample_in_every_embedded_command_and_never_on_redis(
        tmp_path: Path, master: None, capsys: pytest.CaptureFixture[str]) -> None:
    """`--clear` on context, history, search, related, annotate, validate, diff and digest: the sample's
    personal fields read as written, one warning each run; with --redis or --kafka it is refused (exit 2)."""
    import json
    folder = write_cartridge(tmp_path / "c")
    clear = write_lines(tmp_path / "clear.jsonl", STREAM)
    runs = [(["context", str(folder), str(clear), "client:c1", "--tenant", "t1", "--json"],
             lambda out: json.loads(out)["labels"]["name"] == SECRET_NAME + " (2)"),
            (["history", str(folder), str(clear), "client:c1", "--tenant", "t1", "--predicate", "name", "--json"],
             lambda out: SECRET_NAME in out),
            (["search", str(folder), str(clear), "Quintana", "--tenant", "t1", "--json"],
             lambda out: json.loads(out)["results"][0]["entity"] == "client:c1"),
            (["related", str(folder), str(clear), "visit:v1", "visit_of", "--tenant", "t1", "--json"],
             lambda out: json.loads(out)["relations"][0]["object"] == "client:c1"),
            (["annotate", str(folder), str(clear), "client:c2", "call", "back", "--scope", "tenant", "--tenant", "t1",
              "--evidence", "e2", "--json"], lambda out: json.loads(out)["fact"]["value"] == "back"),
            (["validate", str(folder), "--events", str(clear)], lambda out: "7 events ok" in out),
            (["diff", str(folder), str(folder), str(clear)], lambda out: "2 tenant(s), 0 whose graph changes" in out)]
    for argv, answered in runs:
        assert main([*argv, "--clear"]) == 0, argv
        got = capsys.readouterr()
        assert answered(got.out), (argv, got.out)
        assert got.err.splitlines() == [CLEAR_WARNING], (argv, got.err)
    assert main(["context", str(folder), str(clear), "client:c1", "--tenant", "t1"]) == 1   # without: refused
    assert "personal data in clear" in capsys.readouterr().err
    for argv in (["context", str(folder), "client:c1", "--tenant", "t1", "--redis", "redis://127.0.0.1:1/0"],
                 ["digest", str(folder), "--tenant", "t1", "--redis", "redis://127.0.0.1:1/0"],
                 ["validate", str(folder), "--kafka", "127.0.0.1:1"]):
        assert main([*argv, "--clear"]) == 2, argv
        err = capsys.readouterr().err
        assert "--clear reads an events file's personal fields in clear, for one embedded run; the Kafka/Redis path " \
               "never takes them in clear" in err, err
        assert "127.0.0.1:1" not in err                     # refused before anything is connected


def test_clear_with_keys_reads_a_file_of_sealed_and_clear_lines(sealed: tuple[Path, Path, Path, Path],
                                                                tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A sample being sealed line by line: `--clear --keys FILE` reads the sealed lines with their keys and the
    clear ones as they are; the graph is the clear stream's."""
    folder, clear, out, keys = sealed
    sealed_lines = out.read_text(encoding="utf-8").splitlines(keepends=True)
    clear_lines = clear.read_text(encoding="utf-8").splitlines(keepends=True)
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text("".join(sealed_lines[:3] + clear_lines[3:]), encoding="utf-8")
    assert main(["digest", str(folder), str(mixed), "--tenant", "t1", "--keys", str(keys), "--clear"]) == 0
    assert capsys.readouterr().out.strip() == digests(folder, clear)["t1"]


def test_serve_and_inspect_take_clear_through_the_one_place_that_opens_an_events_file(
        tmp_path: Path, master: None, capsys: pytest.CaptureFixture[str]) -> None:
    """`keel serve` and `keel inspect` (plug-ins) get `--clear` from keel.cli and honour it where every command
    opens its graph (keel.connect.open_graph): the served graph holds the sample's clear values; several
    cartridges read together warn once; with --redis it is refused."""
    from inspector.cli import _open as open_inspected
    from keel.cli import build_parser
    from keel.errors import UsageError
    from tools_server.cli import _open_backend
    folder = write_cartridge(tmp_path / "c")
    clear = write_lines(tmp_path / "clear.jsonl", STREAM)
    parser = build_parser()
    backend = _open_backend(parser.parse_args(["serve", str(folder), "--events", str(clear), "--clear"]))
    try:
        assert backend.graph.tools(tenant="t1").context("client:c1")["labels"]["name"] == SECRET_NAME + " (2)"
    finally:
        backend.close()
    assert capsys.readouterr().err.splitlines() == [CLEAR_WARNING]
    graphs = open_inspected(parser.parse_args(["inspect", str(folder), "--events", str(clear), "--clear"]))
    try:
        assert graphs["clinic"].tools(tenant="t2").context("client:c1")["labels"]["name"] == "Other Tenant"
    finally:
        for graph in graphs.values():
            graph.close()
    assert capsys.readouterr().err.splitlines() == [CLEAR_WARNING]
    other = tmp_path / "other"
    other.mkdir()
    (other / "cartridge.yaml").write_text((folder / "cartridge.yaml").read_text(encoding="utf-8")
                                          .replace("name: clinic", "name: spa").replace("client", "guest")
                                          .replace("visit", "stay"), encoding="utf-8")
    guests = write_lines(tmp_path / "guests.jsonl", [
        envelope(1, "t1", "guest.registered", "guest:g1", {"name": "Eva Mora", "phone": "+57 300 555 0909"})])
    assert main(["digest", f"{folder},{other}", f"{clear},{guests}", "--tenant", "t1", "--clear"]) == 0
    assert capsys.readouterr().err.splitlines() == [CLEAR_WARNING.replace("of 'clinic' are", "of 'clinic', 'spa' are")]
    with pytest.raises(UsageError, match="--clear reads an events file's personal fields"):
        _open_backend(parser.parse_args(["serve", str(folder), "--redis", "redis://127.0.0.1:1/0", "--clear"]))


def test_a_demo_of_a_personal_cartridge_reads_its_sample_in_clear_and_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`keel demo` has no key file: it reads its cartridge's sample as --clear does, with the same warning."""
    folder = write_cartridge(tmp_path / "c")
    write_lines(folder / "events.jsonl", STREAM)
    (folder / "demo.py").write_text("def run(ctx):\n    ctx.say(ctx.tools('t1').context('client:c1')['labels']"
                                    "['name'])\n", encoding="utf-8")
    assert main(["demo", str(folder)]) == 0
    got = capsys.readouterr()
    assert got.out.strip() == SECRET_NAME + " (2)"
    assert got.err.splitlines() == [CLEAR_WARNING.replace("--clear:", "keel demo reads its sample as --clear does:")]
