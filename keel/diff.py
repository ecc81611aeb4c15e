"""`keel diff`: what a cartridge change does to every tenant's graph, before it is deployed.

Both cartridges build their graphs of the same log (keel/log_check.py: an events file, or the cartridge's
topic), and each tenant's graphs are compared timeline by timeline: entities, labels (the `ref` included),
facts, notes and relations added, removed or changed (a changed timeline holds other versions: other values,
times or provenance), counted, with a few examples each, and the events one cartridge applies and the other
refuses. That is what `keel replay --all` with the new cartridge will do to each tenant.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .log_check import LogBuild
from .store.base import Key
from .store.memory import MemoryStore
from .timeline import Assertion
from .times import format_time

EXAMPLES = 3
KINDS = ("entities", "labels", "facts", "notes", "relations")


@dataclass
class Change:
    """One kind of thing of a tenant's graph: how many were added, removed or changed, and a few of each."""
    added: int = 0
    removed: int = 0
    changed: int = 0
    examples: dict[str, list[str]] = field(default_factory=lambda: {"added": [], "removed": [], "changed": []})

    def note(self, how: str, example: str) -> None:
        setattr(self, how, getattr(self, how) + 1)
        if len(self.examples[how]) < EXAMPLES:
            self.examples[how].append(example)

    @property
    def any(self) -> bool:
        return bool(self.added or self.removed or self.changed)


@dataclass
class TenantDiff:
    tenant: str
    kinds: dict[str, Change] = field(default_factory=lambda: {k: Change() for k in KINDS})
    refused_by_new: list[str] = field(default_factory=list)      # event ids the old cartridge applied
    applied_by_new: list[str] = field(default_factory=list)      # event ids the old cartridge refused

    @property
    def changed(self) -> bool:
        return any(c.any for c in self.kinds.values()) or bool(self.refused_by_new or self.applied_by_new)

    def to_json(self) -> dict[str, Any]:
        return {"tenant": self.tenant, "changed": self.changed,
                **{k: {"added": c.added, "removed": c.removed, "changed": c.changed, "examples": c.examples}
                   for k, c in self.kinds.items()},
                "events": {"refused_by_new": len(self.refused_by_new), "applied_by_new": len(self.applied_by_new),
                           "examples": {"refused_by_new": self.refused_by_new[:EXAMPLES],
                                        "applied_by_new": self.applied_by_new[:EXAMPLES]}}}


def _kind(key: Key) -> str:
    if key[0] == "r":
        return "relations"
    if key[0] == "f":
        return "facts" if key[3] == "" else "notes"
    return "labels" if key[0] == "l" else "entities"


def _name(key: Key) -> str:
    if key[0] == "r":
        return f"{key[1]} {key[2]} {key[3]}"
    if key[0] == "f":
        return f"{key[1]} {key[2]}" + (f" ({key[3]})" if key[3] else "")
    if key[0] == "l":
        return f"{key[1]} {key[2]}"
    return key[1]


def _current(assertions: list[Assertion], relation: bool = False) -> str:
    last = assertions[-1]
    return "ended" if last.closed else "linked" if relation else _short(last.value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _difference(old: list[Assertion], new: list[Assertion]) -> str:
    """Where two timelines of one key first differ, in words."""
    for a, b in zip(old, new, strict=False):
        if a != b:
            if a.point != b.point:
                return f"a version at {format_time(a.point)} is at {format_time(b.point)}"
            if a.value != b.value or a.closed != b.closed:
                return (f"at {format_time(a.point)}: {'ended' if a.closed else _short(a.value)} -> "
                        f"{'ended' if b.closed else _short(b.value)}")
            return f"at {format_time(a.point)}: provenance differs"
    return f"{len(old)} -> {len(new)} version(s), now {_current(new) if new else 'none'}"


def compare_tenant(tenant: str, old: MemoryStore, new: MemoryStore) -> TenantDiff:
    """One tenant's two graphs, timeline by timeline."""
    out = TenantDiff(tenant)
    before: dict[Key, list[Assertion]] = dict(old.dump(tenant))
    after: dict[Key, list[Assertion]] = dict(new.dump(tenant))
    owners: dict[str, tuple[set[Key], set[Key]]] = {}
    for key in before.keys() | after.keys():
        ends = (key[1], key[3]) if key[0] == "r" else (key[1],)
        for entity in ends:
            mine = owners.setdefault(entity, (set(), set()))
            if key in before:
                mine[0].add(key)
            if key in after:
                mine[1].add(key)
    entities = out.kinds["entities"]
    for entity, (had, has) in sorted(owners.items()):
        if not had:
            entities.note("added", entity)
        elif not has:
            entities.note("removed", entity)
        elif had != has or any(before[k] != after[k] for k in had):
            entities.note("changed", entity)
    for key in sorted(before.keys() | after.keys()):
        if key[0] == "e":
            continue                            # an upsert without labels: counted with its entity
        change, relation = out.kinds[_kind(key)], key[0] == "r"
        if key not in before:
            change.note("added", f"{_name(key)}: {_current(after[key], relation)}" if relation else
                        f"{_name(key)} = {_current(after[key])}")
        elif key not in after:
            change.note("removed", f"{_name(key)} (was {_current(before[key], relation)})")
        elif before[key] != after[key]:
            change.note("changed", f"{_name(key)}: {_difference(before[key], after[key])}")
    return out


@dataclass
class DiffReport:
    old: LogBuild
    new: LogBuild
    read: int
    tenants: list[TenantDiff]

    @property
    def changed(self) -> list[TenantDiff]:
        return [t for t in self.tenants if t.changed]

    @property
    def newly_refused(self) -> int:
        return sum(len(t.refused_by_new) for t in self.tenants)

    def to_json(self) -> dict[str, Any]:
        return {"old": str(self.old.cartridge.path), "new": str(self.new.cartridge.path), "read": self.read,
                "tenants": [t.to_json() for t in self.tenants], "changed_tenants": len(self.changed),
                "refused": {"old": len(self.old.refused), "new": len(self.new.refused)},
                "refused_by_new": self.newly_refused}


def compare(old: LogBuild, new: LogBuild, read: int) -> DiffReport:
    """Every tenant either build holds, compared."""
    tenants = []
    for tenant in sorted(old.tenants | new.tenants):
        diff = compare_tenant(tenant, old.store, new.store)
        had, has = old.applied_ids.get(tenant, set()), new.applied_ids.get(tenant, set())
        diff.refused_by_new = sorted(had - has)
        diff.applied_by_new = sorted(has - had)
        tenants.append(diff)
    return DiffReport(old, new, read, tenants)


def render(report: DiffReport) -> str:
    """The human report: one block per tenant that changes, one line for those that do not, a summary."""
    lines = []
    for t in report.tenants:
        if not t.changed:
            lines.append(f"tenant {t.tenant}: unchanged")
            continue
        lines.append(f"tenant {t.tenant}: changes")
        if t.refused_by_new or t.applied_by_new:
            lines.append(f"  events: {len(t.refused_by_new)} applied now and refused by the new cartridge"
                         + (f" (e.g. {', '.join(t.refused_by_new[:EXAMPLES])})" if t.refused_by_new else "")
                         + f", {len(t.applied_by_new)} refused now and applied by the new cartridge"
                         + (f" (e.g. {', '.join(t.applied_by_new[:EXAMPLES])})" if t.applied_by_new else ""))
        for kind, c in t.kinds.items():
            if not c.any:
                continue
            lines.append(f"  {kind}: {c.added} added, {c.removed} removed, {c.changed} changed")
            for how in ("added", "removed", "changed"):
                for example in c.examples[how]:
                    lines.append(f"    {how}: {example}")
    changed = len(report.changed)
    lines.append(f"{len(report.tenants)} tenant(s), {changed} whose graph changes with the new cartridge; "
                 f"{report.read} envelope(s) read, {len(report.old.refused)} refused by the old cartridge, "
                 f"{len(report.new.refused)} by the new")
    if changed and not report.newly_refused:
        new = report.new.cartridge.path
        lines.append(f"to apply it: deploy {new} to the workers, then `keel replay {new} --all` rebuilds the "
                     f"{changed} tenant(s) whose graph changes as shown above.")
    return "\n".join(lines)
