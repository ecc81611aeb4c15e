"""Rules checked against a graph built from a sample stream (`keel validate --events`).

Compiling a `when:` catches syntax and undeclared parameters (keel/rules.py); only data tells whether the
facts and labels it names exist on entities of its type, and whether its operations fit their values (a
string compared with a number is a null verdict at every question, never an answer).
"""
from __future__ import annotations

from collections.abc import Iterable

from . import reading
from .cartridge import Cartridge
from .rules import check_names, verdict
from .store.base import REF_LABEL, Key, Store, entities_of
from .times import Micros

MAX_ENTITIES = 1000     # entities of a rule's type evaluated per tenant: enough to meet every shape of a sample


def names_by_type(keys: Iterable[Key]) -> dict[str, dict[str, set[str]]]:
    """`{entity type: {"facts": predicates, "labels": labels}}` of the domain facts and labels among `keys`."""
    out: dict[str, dict[str, set[str]]] = {}
    for key in keys:
        if key[0] == "f" and key[3] == "":
            var = "facts"
        elif key[0] == "l" and key[2] != REF_LABEL:
            var = "labels"
        else:
            continue
        out.setdefault(key[1].partition(":")[0], {"facts": set(), "labels": set()})[var].add(key[2])
    return out


def types_present(store: Store) -> set[str]:
    """The entity types of every entity any timeline of `store` involves."""
    return {e.partition(":")[0] for tenant in store.tenants() for key, _ in store.dump(tenant)
            for e in entities_of(key)}


def unmet_rules(cartridge: Cartridge, store: Store) -> list[str]:
    """`rules.<name>: …` for each rule whose entity type has no entity in `store`: nothing to check it on."""
    present = types_present(store)
    return [f"rules.{r.name}: not checked against the stream: it holds no {r.applies_to} entity"
            for r in cartridge.rules.values() if r.applies_to not in present]


def stream_problems(cartridge: Cartridge, store: Store, at: Micros) -> list[str]:
    """Names rules read that no entity of their type has in `store`, and evaluations that fail on its
    entities as of `at` (the first failing entity per rule and reason), one line per problem. A rule whose
    type has no entity in the stream is no problem (a sample need not hold every type; see unmet_rules)."""
    keys = [key for tenant in store.tenants() for key, _ in store.dump(tenant)]
    seen = names_by_type(keys)
    present = {e.partition(":")[0] for key in keys for e in entities_of(key)}
    problems: list[str] = []
    for rule in cartridge.rules.values():
        if rule.applies_to in present:
            problems += check_names(rule, seen.get(rule.applies_to, {"facts": set(), "labels": set()}),
                                    "met on the stream's")
    for tenant in store.tenants():
        entities = sorted({key[1] for key, _ in store.dump(tenant)})
        for rule in (r for r in cartridge.rules.values() if r.program is not None):
            reasons: set[str] = set()
            of_type = [e for e in entities if e.partition(":")[0] == rule.applies_to][:MAX_ENTITIES]
            declared = cartridge.relations_of(rule.applies_to)
            for entity in of_type:
                view = reading.view(store, tenant, entity, at=at)
                if view is None:
                    continue
                reason = verdict(rule, view.facts, view.info.labels, view.relations, entity, at,
                                 declared).get("reason")
                if reason and reason not in reasons:
                    reasons.add(reason)
                    problems.append(f"rules.{rule.name}.when: on {entity} (tenant {tenant}): {reason}")
    return problems
