"""The five tools over several cartridges of one tenant: one Tools per cartridge, one answer per call.

An entity's type says which cartridge's graph answers (`context`, `history`, `related`, `annotate`); `search`
and `history` without an entity ask every cartridge and merge. A cross-cartridge relation (an end written
`<cartridge>.<type>`) lives in its declaring cartridge's graph; `context`, `related` and `history` of the other
end read it there too, so it is followed in both directions. Ids, types and relation names read as the
CartridgeSet shows them (`finance.debt:visa` for a `qualified: true` cartridge). docs/semantics.md,
"Several cartridges per tenant".
"""
from __future__ import annotations

import copy
import re
from collections.abc import Callable
from typing import Any, TypeVar, cast

from .cartridge import Cartridge
from .cartridge_set import CartridgeSet, qualify
from .changes import parse_cursor
from .errors import UnknownEntity, UnknownTenant, UsageError
from .identifiers import ENTITY_ID_PATTERN
from .results import (
    AnnotateResult,
    ChangesResult,
    ContextResult,
    HistoryResult,
    Known,
    RelatedResult,
    Relation,
    RelationVersion,
    Scope,
    SearchResult,
)
from .times import Micros, format_time, parse_time
from .tool_args import DEFAULT_RESULTS, MAX_RESULTS, Time, count, given, history_args, time_arg
from .tools import NO_VALUE, Tools

_R = TypeVar("_R", bound=Known)
_OPAQUE = frozenset({"value", "labels", "old", "new", "rules", "evidence", "superseded_by", "corrected_by",
                     "source", "by", "reason", "event_id", "message", "cursor"})
_ENTITY_ID = re.compile(ENTITY_ID_PATTERN)
_SINCE = re.compile(r"s-?[0-9]{1,17}")


class ToolSet:
    """The five tools (same methods and results as keel.tools.Tools) over several cartridges' graphs, bound to
    one tenant and caller. Built by keel.connect.GraphSet.tools."""

    def __init__(self, cartridges: CartridgeSet, parts: dict[str, Tools]) -> None:
        self.cartridges = cartridges
        self.parts = parts                           # cartridge name -> its Tools (same tenant and caller)
        first = next(iter(parts.values()))
        self.tenant, self.agent, self.task = first.tenant, first.agent, first.task

    @property
    def clock(self) -> Callable[[], Micros]:
        return next(iter(self.parts.values())).clock

    @clock.setter
    def clock(self, clock: Callable[[], Micros]) -> None:
        for tools in self.parts.values():
            tools.clock = clock

    def __copy__(self) -> ToolSet:
        """A copy whose parts are copies too (the server pins a copy's clock for one call)."""
        return ToolSet(self.cartridges, {name: copy.copy(t) for name, t in self.parts.items()})

    # ---- readers ----------------------------------------------------------------------------

    def context(self, entity: str, *, at: Time = None, known_at: Time = None) -> ContextResult:
        cartridge, local = self._route(entity)
        result = self._public(cartridge, self.parts[cartridge.name].context(local, at=at, known_at=known_at))
        cross = self._cross_related(cartridge, local, None, at, known_at)
        result["relations"] = result["relations"] + [r for c in cross for r in cast(list[Relation],
                                                                                    c["relations"])]
        return _known_of(result, [result, *cross])

    def history(self, entity: str | None = None, predicate: str | None = None, *, known_at: Time = None,
                since: Time = None, type: str | None = None, cursor: str | None = None,
                limit: int | None = None) -> HistoryResult | ChangesResult:
        args = history_args(entity, predicate, known_at, since, type, cursor, limit)
        if args.entity is None:
            return self._changes(args.since, args.type, args.cursor, args.limit)
        predicate, known_at = args.predicate, args.known_at
        cartridge, local = self._route(args.entity)
        crossing = self.cartridges.cross_relations(cartridge, local.partition(":")[0])
        own = predicate                              # a fact, label or relation name of the entity's cartridge
        cross = crossing
        if isinstance(predicate, str) and predicate:
            found = self.cartridges.relation_owner(predicate)
            if found is not None and found[0] is cartridge:
                own = found[1]                       # a qualified relation name, as its cartridge declares it
            cross = [x for x in crossing if qualify(*x) == predicate]
        result: HistoryResult
        try:
            result = self._public(cartridge, self.parts[cartridge.name].history(local, own, known_at=known_at))
        except UsageError:                           # not a name of its own cartridge: another's relation?
            if not cross:
                raise
            self.parts[cartridge.name].context(local, known_at=known_at)        # the entity exists
            result = {"entity": self.cartridges.public_entity(cartridge, local), "versions": [], "labels": [],
                      "relations": [], "known_through": None}
        parts: list[Known] = [result]
        for other, name in cross:
            try:
                found_h = self.parts[other.name].history(local, name, known_at=known_at)
            except (UnknownEntity, UnknownTenant, UsageError):      # no such relation recorded there
                continue
            found_h = self._public(other, found_h)
            result["relations"] = result["relations"] + cast(list[RelationVersion], found_h["relations"])
            parts.append(found_h)
        return _known_of(result, parts)

    def search(self, query: str, *, type: str | None = None, limit: int | None = DEFAULT_RESULTS, at: Time = None,
               known_at: Time = None) -> SearchResult:
        type, limit = given(type), count(limit, "limit", DEFAULT_RESULTS, MAX_RESULTS)
        if type is not None:
            cartridge, local_type = self._type(type, "type")
            return self._public(cartridge, self.parts[cartridge.name].search(
                query, type=local_type, limit=limit, at=at, known_at=known_at))
        answers: list[SearchResult] = []
        for cartridge in self.cartridges.cartridges:
            try:
                answers.append(self._public(cartridge, self.parts[cartridge.name].search(
                    query, limit=limit, at=at, known_at=known_at)))
            except UnknownTenant:
                continue                             # the tenant has no events in this cartridge
        if not answers:
            raise UnknownTenant(self.tenant)
        hits = sorted((h for a in answers for h in a["results"]), key=lambda h: (-h["score"], h["entity"]))[:limit]
        if hits:
            message = f"{len(hits)} result{'s' if len(hits) != 1 else ''}"
        else:
            message = (f"no entities match {query!r}; try broader or fewer words (a name, a product, a label) "
                       f"or an entity type such as {', '.join(self.cartridges.types())}")
        result: SearchResult = {"query": query, "results": hits, "message": message, "known_through": None}
        return _known_of(result, cast(list[Known], answers))

    def related(self, entity: str, relation: str | None = None, *, at: Time = None,
                known_at: Time = None) -> RelatedResult:
        cartridge, local = self._route(entity)
        own: str | None = None
        relation = given(relation)
        if relation is not None:
            found = self.cartridges.relation_owner(relation) if isinstance(relation, str) else None
            if found is None:
                raise UsageError(f"relation: {relation!r} is not a relation of the cartridges; use one of "
                                 f"{', '.join(self.cartridges.relations())}")
            own = found[1] if found[0] is cartridge else None
            if own is None and found not in self.cartridges.cross_relations(cartridge, local.partition(":")[0]):
                raise UsageError(f"relation: {relation} has no end at "
                                 f"{self.cartridges.public_type(cartridge, local.partition(':')[0])}")
            wanted: tuple[Cartridge, str] | None = found
        else:
            wanted = None
        tools = self.parts[cartridge.name]
        if own is not None or wanted is None:
            result = self._public(cartridge, tools.related(local, own, at=at, known_at=known_at))
        else:
            result = self._public(cartridge, tools.related(local, at=at, known_at=known_at))
            result["relations"] = []                 # the entity exists; only the other cartridge's relation
        cross = self._cross_related(cartridge, local, wanted, at, known_at)
        result["relations"] = result["relations"] + [r for c in cross for r in cast(list[Relation],
                                                                                    c["relations"])]
        return _known_of(result, [result, *cross])

    # ---- the writer -------------------------------------------------------------------------

    def annotate(self, entity: str, predicate: str, value: Any = NO_VALUE, scope: Scope | None = None, *,
                 evidence: str | None = None, withdraw: bool = False, reason: str | None = None) -> AnnotateResult:
        cartridge, local = self._route(entity, notes_on=True)
        return self._public(cartridge, self.parts[cartridge.name].annotate(
            local, predicate, value, scope, evidence=evidence, withdraw=withdraw, reason=reason))

    # ---- helpers ----------------------------------------------------------------------------

    def _route(self, entity: object, notes_on: bool = False) -> tuple[Cartridge, str]:
        """The cartridge whose graph holds an entity, and the entity's id there (its type unqualified).
        `notes_on`: also type:<public type> and rule:<rule> of a global note."""
        if not isinstance(entity, str) or len(entity) > 330 or ":" not in entity:
            raise UsageError(f"entity {_clip(entity)}: use '<entity type>:<id>', e.g. from search results")
        kind, _, ident = entity.partition(":")
        if notes_on and kind == "type":
            cartridge, local_type = self._type(ident, "entity")
            return cartridge, f"type:{local_type}"
        if notes_on and kind == "rule":
            owners = [c for c in self.cartridges.cartridges if ident in c.rules]
            if len(owners) != 1:
                raise UsageError(f"entity {_clip(entity)}: " + (
                    f"rules of that name are in {', '.join(c.name for c in owners)}" if owners else
                    "no cartridge has that rule"))
            return owners[0], entity
        if not _ENTITY_ID.fullmatch(ident):
            raise UsageError(f"entity {_clip(entity)}: use '<entity type>:<id>', e.g. from search results")
        cartridge, local_type = self._type(kind, "entity")
        return cartridge, f"{local_type}:{ident}"

    def _type(self, public: object, arg: str) -> tuple[Cartridge, str]:
        owner = self.cartridges.type_owner(public) if isinstance(public, str) else None
        if owner is None:
            raise UsageError(f"{arg}: {_clip(public)} is not an entity type of the cartridges; use one of "
                             f"{', '.join(self.cartridges.types())}")
        return owner

    def _cross_related(self, cartridge: Cartridge, local: str, wanted: tuple[Cartridge, str] | None,
                       at: Time, known_at: Time) -> list[RelatedResult]:
        """The other cartridges' relations ending at an entity (of `wanted` only, when given), as `related`
        answers them in those graphs."""
        found: list[RelatedResult] = []
        for other, name in self.cartridges.cross_relations(cartridge, local.partition(":")[0]):
            if wanted is not None and (other, name) != wanted:
                continue
            try:
                answer = self.parts[other.name].related(local, name, at=at, known_at=known_at)
            except (UnknownEntity, UnknownTenant):      # nothing of it recorded in that graph
                continue
            found.append(self._public(other, answer))
        return found

    def _changes(self, since: Time, type: str | None, cursor: str | None, limit: int) -> ChangesResult:
        """Every cartridge's changes after its place in the cursor (else after `since`), merged in recorded
        order. A cartridge that gave more than the answer takes is read again for exactly what was taken, so
        its place in the next cursor is right after it; one that gave nothing taken keeps its place."""
        places = _parse_cursor(cursor, self.cartridges)
        if places is None:
            if since is None:
                raise UsageError("since: a recorded time (RFC 3339 or a date), e.g. the known_through of your "
                                 "last answer; or cursor: a previous changes answer's cursor")
            start = time_arg(since, "since")
            assert start is not None
            places = {c.name: f"s{start}" for c in self.cartridges.cartridges}
        chosen = [self._type(type, "type")] if type is not None else [(c, None) for c in self.cartridges.cartridges]
        pages: dict[str, tuple[str | None, ChangesResult]] = {}
        for cartridge, local_type in chosen:
            place = places.get(cartridge.name) or f"s{min(_place_time(p) for p in places.values())}"
            try:
                pages[cartridge.name] = (local_type, self._page(cartridge.name, place, local_type, limit))
            except UnknownTenant:
                continue                             # the tenant has no events in this cartridge
        if not pages:
            raise UnknownTenant(self.tenant)
        order = sorted((parse_time(r["recorded_at"]), name, i) for name, (_, page) in pages.items()
                       for i, r in enumerate(page["changes"]))
        rows, rest = order[:limit], order[limit:]
        more, throughs = bool(rest), []
        for name, (local_type, page) in pages.items():
            taken = sum(1 for _, n, _ in rows if n == name)
            left = [t for t, n, _ in rest if n == name]
            if left:                                 # complete only up to its first change not taken
                throughs.append(left[0] - 1)
                if taken:
                    places[name] = self._page(name, places.get(name) or "", local_type, taken)["cursor"]
            else:
                places[name] = page["cursor"]
                if page.get("known_through"):
                    throughs.append(parse_time(str(page["known_through"])))
            more = more or page["more"]
        result: ChangesResult = {
            "since": format_time(time_arg(since, "since")) if cursor is None else None, "type": type,
            "changes": [self._public(self.cartridges.by_name[n], pages[n][1]["changes"][i]) for _, n, i in rows],
            "cursor": _cursor_text(places), "more": more, "known_through": None}
        _known_of(result, [page for _, page in pages.values()])
        result["known_through"] = format_time(min(throughs)) if throughs else None
        return result

    def _page(self, name: str, place: str, local_type: str | None, limit: int) -> ChangesResult:
        """One cartridge's changes page from its place: `s<micros>` (recorded after it) or its own cursor."""
        tools = self.parts[name]
        if place.startswith("s"):
            return cast(ChangesResult, tools.history(since=format_time(int(place[1:])), type=local_type,
                                                     limit=limit))
        return cast(ChangesResult, tools.history(cursor=place, type=local_type, limit=limit))

    def _public(self, cartridge: Cartridge, result: Any) -> Any:
        """A result of `cartridge`'s Tools with ids, types and relation names as agents see them."""
        if not cartridge.spec.qualified and not cartridge.foreign_types():
            return result
        return _translate(result, cartridge, self.cartridges)


def _translate(value: Any, cartridge: Cartridge, cartridges: CartridgeSet, key: str | None = None) -> Any:
    if isinstance(value, list):
        return [_translate(v, cartridge, cartridges, key) for v in value]
    if isinstance(value, dict):
        relation_row = value.get("what") == "relation" or "subject" in value
        out = {}
        for k, v in value.items():
            if k in _OPAQUE or v is None:
                out[k] = v
            elif k in ("entity", "subject", "object") and isinstance(v, str):
                out[k] = cartridges.public_entity(cartridge, v)
            elif k == "type" and isinstance(v, str) and key != "changes":
                out[k] = cartridges.public_type(cartridge, v)
            elif k == "relation" and isinstance(v, str) or k == "name" and relation_row and isinstance(v, str):
                out[k] = qualify(cartridge, v)
            elif k == "attached_to" and isinstance(v, str) and v.startswith("type:"):
                out[k] = "type:" + cartridges.public_type(cartridge, v[5:])
            else:
                out[k] = _translate(v, cartridge, cartridges, k)
        return out
    return value


def _known_of(result: _R, parts: list[Known]) -> _R:
    """An answer made of several graphs' answers is complete through the earliest of theirs; its lag is the
    sum of theirs."""
    through = [p["known_through"] for p in parts if p.get("known_through")]
    result["known_through"] = min(through, key=lambda t: parse_time(str(t))) if through else None
    applied = [p["applied_through"] for p in parts if p.get("applied_through")]
    if applied:
        result["applied_through"] = min(applied, key=lambda t: parse_time(str(t)))
    lags = [p["lag"] for p in parts if "lag" in p]
    if lags:
        result["lag"] = sum(lags)
    return result


def _parse_cursor(cursor: object, cartridges: CartridgeSet) -> dict[str, str] | None:
    """`<cartridge>~<its cursor>` pairs joined by `,`, as a previous answer gave them."""
    if cursor is None or cursor == "":
        return None
    bad = UsageError("cursor: pass back the `cursor` of a previous changes answer unchanged")
    if not isinstance(cursor, str) or len(cursor) > 2048:
        raise bad
    places: dict[str, str] = {}
    for part in cursor.split(","):
        name, sep, place = part.partition("~")
        if not sep or name not in cartridges.by_name or name in places:
            raise bad
        if not (_SINCE.fullmatch(place) or parse_cursor(place)):
            raise bad
        places[name] = place
    return places


def _cursor_text(places: dict[str, str]) -> str:
    return ",".join(f"{name}~{place}" for name, place in sorted(places.items()))


def _place_time(place: str) -> Micros:
    """The recorded time a cartridge's place resumes from: `s<micros>`, or its cursor's last field."""
    if place.startswith("s"):
        return int(place[1:])
    parsed = parse_cursor(place)
    return 0 if parsed is None else parsed.recorded_at


def _clip(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "…"
