"""Versions of the finance cartridge for the tests of issue 29 (versioned event types, upcasting, diff, schema):
the shipped cartridge changed the way a product's catalog changes. No tests here."""
from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
FINANCE = ROOT / "cartridges" / "finance"
EVENTS = FINANCE / "events.jsonl"

# version 2 -> 3 of debt.snapshot, in Python: the period's first day, from its month
UPCASTER_2_TO_3 = '''from keel import Registry
registry = Registry()


@registry.upcast("debt.snapshot", 2)
def snapshot_2_to_3(payload):
    payload["period_start"] = payload["month"] + "-01"
    return payload
'''


def variant(dest: Path, edit: Callable[[dict[str, Any]], None], *, handlers: str | None = None,
            source: Path = FINANCE) -> Path:
    """A copy of a cartridge folder (its events file included) with cartridge.yaml changed by `edit`."""
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    for f in source.iterdir():
        if f.is_file() and f.name != "cartridge.yaml":
            shutil.copy(f, dest / f.name)
    doc = yaml.safe_load((source / "cartridge.yaml").read_text())
    edit(doc)
    (dest / "cartridge.yaml").write_text(yaml.safe_dump(doc, sort_keys=False, allow_unicode=True))
    if handlers is not None:
        (dest / "handlers.py").write_text(handlers)
    return dest


def snapshot(doc: dict[str, Any]) -> dict[str, Any]:
    return doc["events"]["debt.snapshot"]


def add_currency(doc: dict[str, Any]) -> None:
    """The issue's change, done right: version 2 of debt.snapshot has a required currency; every version-1
    snapshot was in COP. The projection is unchanged (the graph too)."""
    e = snapshot(doc)
    e["version"] = 2
    e["payload"]["currency"] = "string"
    e["upcast"] = {1: [{"add": {"currency": "COP"}}]}


def label_currency(doc: dict[str, Any]) -> None:
    """Version 2 as above, and the debt gets a `currency` label: the graph changes."""
    add_currency(doc)
    snapshot(doc)["project"][0]["upsert"]["labels"]["currency"] = "{currency}"


def version_3(doc: dict[str, Any]) -> None:
    """Version 3: balance_cop renamed to balance (YAML, 1 -> 2 with the currency), and period_start (a date)
    added by the Python upcaster UPCASTER_2_TO_3 (2 -> 3)."""
    label_currency(doc)
    e = snapshot(doc)
    e["version"] = 3
    e["payload"]["balance"] = e["payload"].pop("balance_cop")
    e["payload"]["period_start"] = "date"
    e["upcast"][1].append({"rename": {"balance_cop": "balance"}})
    e["project"][2]["facts"]["set"] = {"balance": "{balance}", "rate_ea_pct": "{rate_ea_pct}",
                                       "installment_cop": "{installment_cop}", "period_start": "{period_start}"}


def breaking(doc: dict[str, Any]) -> None:
    """The issue's change done wrong: a required field added to version 1, which no recorded event has."""
    snapshot(doc)["payload"]["currency"] = "string"
