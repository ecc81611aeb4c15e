"""Several cartridges served to one tenant: the names agents see, checked together.

Each cartridge keeps its own topic, namespace, store, rules and replay; this module only decides how their
entity types and relation names read side by side. A type or relation name is public as declared, or as
`<cartridge>.<name>` when its cartridge says `qualified: true`; two cartridges may not show the same public
name. A relation end written `<cartridge>.<type>` (a cross-cartridge relation) names another cartridge's type:
the declaring cartridge's store keeps that end's plain id (`debt:visa`), and reads show it under its owner's
public type. docs/cartridges.md, "Several cartridges per tenant".
"""
from __future__ import annotations

from collections.abc import Sequence

from .cartridge import Cartridge, load_cartridge
from .errors import CartridgeInvalid, UsageError


def cartridge_paths(text: str | Sequence[str]) -> list[str]:
    """Cartridge folders as a command takes them: one folder, several separated by commas, or a list of such."""
    parts = [text] if isinstance(text, str) else list(text)
    paths = [p.strip() for part in parts for p in part.split(",")]
    if not paths or any(not p for p in paths):
        raise UsageError("give a cartridge folder, or several separated by commas (cartridges/a,cartridges/b)")
    return paths


def load_cartridges(text: str | Sequence[str]) -> list[Cartridge]:
    """Every cartridge of `text` (keel.cartridge_set.cartridge_paths), loaded and validated; two with the same
    name are a usage error."""
    cartridges = [load_cartridge(p) for p in cartridge_paths(text)]
    names = [c.name for c in cartridges]
    if len(set(names)) != len(names):
        raise UsageError(f"the same cartridge is named twice: {', '.join(names)}")
    return cartridges


class CartridgeSet:
    """Cartridges read together: public names, where a public type or relation lives, and how an id stored in
    one cartridge's graph reads. Raises CartridgeInvalid with every clash and dangling cross reference."""

    def __init__(self, cartridges: Sequence[Cartridge]) -> None:
        self.cartridges = sorted(cartridges, key=lambda c: c.name)
        self.by_name = {c.name: c for c in self.cartridges}
        self._types: dict[str, tuple[Cartridge, str]] = {}         # public type -> (cartridge, its type)
        self._relations: dict[str, tuple[Cartridge, str]] = {}     # public relation -> (cartridge, its name)
        problems = check_together(self.cartridges)
        if problems:
            raise CartridgeInvalid(", ".join(str(c.path) for c in self.cartridges), problems)
        for c in self.cartridges:
            for t in c.spec.entities:
                self._types[qualify(c, t)] = (c, t)
            for r in c.spec.relations:
                self._relations[qualify(c, r)] = (c, r)

    @property
    def name(self) -> str:
        """The cartridges' names joined by - (a cartridge name has none), for records about the whole set: its
        call records, and the audit topic keel.<name>.audit."""
        return "-".join(c.name for c in self.cartridges)

    def types(self) -> list[str]:
        return sorted(self._types)

    def relations(self) -> list[str]:
        return sorted(self._relations)

    def type_owner(self, public: str) -> tuple[Cartridge, str] | None:
        return self._types.get(public)

    def relation_owner(self, public: str) -> tuple[Cartridge, str] | None:
        return self._relations.get(public)

    def public_type(self, store_of: Cartridge, kind: str) -> str:
        """How a type read in `store_of`'s graph reads publicly: its own type, or the owner's of a foreign end."""
        if kind in store_of.spec.entities:
            return qualify(store_of, kind)
        foreign = store_of.foreign_types().get(kind)
        if foreign is None:
            return kind                          # type:<t> and rule:<r> of a global note's attachment
        owner, _, plain = foreign.partition(".")
        return qualify(self.by_name[owner], plain)

    def public_entity(self, store_of: Cartridge, entity: str) -> str:
        kind, sep, ident = entity.partition(":")
        return f"{self.public_type(store_of, kind)}{sep}{ident}" if sep else entity

    def cross_relations(self, owner: Cartridge, kind: str) -> list[tuple[Cartridge, str]]:
        """(cartridge, relation) of the other cartridges' relations with an end at `owner`'s type `kind`."""
        wanted = f"{owner.name}.{kind}"
        return [(c, name) for c in self.cartridges if c is not owner
                for name, r in sorted(c.spec.relations.items()) if wanted in (r.from_, r.to)]


def qualify(cartridge: Cartridge, name: str) -> str:
    """A type or relation name as agents see it: `<cartridge>.<name>` for a `qualified: true` cartridge."""
    return f"{cartridge.name}.{name}" if cartridge.spec.qualified else name


def check_together(cartridges: Sequence[Cartridge]) -> list[str]:
    """Clashes of public names (naming both cartridges) and cross references to a cartridge or type not in the
    set; one line per problem."""
    problems: list[str] = []
    names = [c.name for c in cartridges]
    for name in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"the cartridge name {name!r} is used by {names.count(name)} of the cartridges")
    for what, of in (("entity type", lambda c: c.spec.entities), ("relation", lambda c: c.spec.relations)):
        seen: dict[str, str] = {}
        for c in cartridges:
            for n in sorted(of(c)):
                public = qualify(c, n)
                if public in seen:
                    problems.append(f"{what} {public!r} is declared by both {seen[public]} and {c.name}: set "
                                    f"`qualified: true` in one of them (its names then read <cartridge>.{n})")
                seen.setdefault(public, c.name)
    by_name = {c.name: c for c in cartridges}
    for c in cartridges:
        for rel, r in sorted(c.spec.relations.items()):
            for end, t in (("from", r.from_), ("to", r.to)):
                if "." not in t:
                    continue
                owner, _, kind = t.partition(".")
                if owner not in by_name:
                    problems.append(f"{c.name}: relations.{rel}.{end}: {t!r} names cartridge {owner!r}, which is "
                                    f"not among the cartridges given ({', '.join(sorted(by_name))})")
                elif kind not in by_name[owner].spec.entities:
                    problems.append(f"{c.name}: relations.{rel}.{end}: {owner} declares no entity type {kind!r}")
    return problems

