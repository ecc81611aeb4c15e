"""A small cartridge nobody ships (for the write-side integrity tests) and helpers to write its events."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CARTRIDGE_YAML = """\
name: {name}
description: accounts whose balance is set by events (write-side integrity tests)
entities:
  acct: {{description: an account}}
  owner: {{description: who holds accounts}}
relations:
  held_by: {{from: acct, to: owner}}
events:
  acct.set:
    subject: acct
    owner: ledger
    payload: {{balance: number, holder: optional string}}
  acct.odd:
    subject: acct
    owner: ledger
    payload: {{kind: string, size: optional integer}}
{extra}"""

HANDLERS = '''\
import datetime
from keel import Registry

registry = Registry()


@registry.on("acct.set")
def acct_set(event, store):
    p = event.payload
    store.upsert_entity(event.tenant, "acct", event.subject_id, ref=f"ledger#{event.subject_id}")
    store.open_fact(event.tenant, event.subject, "balance", p["balance"], valid_from=event.occurred_at)
    if p.get("holder"):
        store.upsert_entity(event.tenant, "owner", p["holder"])
        store.link(event.tenant, event.subject, "held_by", f"owner:{p['holder']}", event.occurred_at)


@registry.on("acct.odd")
def acct_odd(event, store):
    kind, size = event.payload["kind"], event.payload.get("size") or 0
    store.open_fact(event.tenant, event.subject, "before", "fine", valid_from=event.occurred_at)
    values = {"set": {1, 2}, "datetime": datetime.datetime(2026, 1, 1), "nan": float("nan"),
              "intkey": {1: "one"}, "big": "x" * size, "deep": {"a": [1, {"b": float("inf")}]}}
    if kind == "label":
        store.upsert_entity(event.tenant, "acct", event.subject_id, note="y" * size)
    elif kind == "swallow":
        try:
            store.open_fact(event.tenant, event.subject, "memo", {1, 2}, valid_from=event.occurred_at)
        except ValueError:
            pass
    else:
        store.open_fact(event.tenant, event.subject, "memo", values[kind], valid_from=event.occurred_at)
'''


def ledger_cartridge(folder: Path, name: str = "ledger", extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cartridge.yaml").write_text(CARTRIDGE_YAML.format(name=name, extra=extra))
    (folder / "handlers.py").write_text(HANDLERS)
    return folder


def acct_set(event_id: str, acct: str, balance: float, occurred_at: str, recorded_at: str | None = None, *,
             tenant: str = "t1", **extra: Any) -> dict[str, Any]:
    env: dict[str, Any] = {"id": event_id, "tenant": tenant, "type": "acct.set", "subject": f"acct:{acct}",
                           "occurred_at": occurred_at, "payload": {"balance": balance, **extra}}
    if recorded_at is not None:
        env["recorded_at"] = recorded_at
    return env


def odd(event_id: str, kind: str, size: int | None = None, *, tenant: str = "t1") -> dict[str, Any]:
    payload: dict[str, Any] = {"kind": kind}
    if size is not None:
        payload["size"] = size
    return {"id": event_id, "tenant": tenant, "type": "acct.odd", "subject": "acct:a1",
            "occurred_at": "2026-03-01", "payload": payload}


def write_events(path: Path, envelopes: list[dict[str, Any] | str]) -> Path:
    path.write_text("".join((e if isinstance(e, str) else json.dumps(e)) + "\n" for e in envelopes))
    return path


def retracted(event_id: str, target: str, subject: str = "acct:a1", recorded_at: str | None = None, *,
              tenant: str = "t1", reason: str | None = None) -> dict[str, Any]:
    env: dict[str, Any] = {"id": event_id, "tenant": tenant, "type": "keel.retracted", "subject": subject,
                           "occurred_at": (recorded_at or "2026-01-01")[:10], "by": "human:ana",
                           "payload": {"event": target, **({"reason": reason} if reason else {})}}
    if recorded_at is not None:
        env["recorded_at"] = recorded_at
    return env


def correction_log() -> list[dict[str, Any]]:
    """A wrong occurred_at corrected, a whole event retracted, and three refusals."""
    return [
        acct_set("e1", "a1", 100, "2026-01-01", "2026-01-02T00:00:00Z", holder="h1"),
        acct_set("e2", "a1", 200, "2026-03-01", "2026-03-02T00:00:00Z"),            # wrong date
        {**acct_set("e3", "a1", 200, "2026-02-01", "2026-03-05T00:00:00Z"), "corrects": "e2", "by": "human:ana"},
        retracted("e4", "e1", recorded_at="2026-03-06T00:00:00Z", reason="entered twice"),
        retracted("e5", "e1", recorded_at="2026-03-07T00:00:00Z"),                  # already retracted
        {**acct_set("e6", "a1", 1, "2026-02-01", "2026-03-08T00:00:00Z"), "corrects": "nope"},   # unknown
        retracted("e7", "e2", tenant="t2", subject="acct:a1", recorded_at="2026-03-09T00:00:00Z"),  # other tenant
    ]
