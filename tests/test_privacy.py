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
