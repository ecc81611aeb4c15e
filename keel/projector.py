"""The write path: envelope → checks → cartridge handler → store, idempotent on event id.

A handler sees the graph as it was before its event and writes through an EventStore that fills in
provenance from the event. Its writes are buffered and applied in one `apply_writes` call together
with the event id, so an event is applied entirely or not at all, and applying it twice changes nothing.
"""
from __future__ import annotations

from typing import Any, Literal

from .cartridge import Cartridge
from .envelope import ANNOTATED, ENTITY, Catalog, Event, Instant
from .errors import EnvelopeRejected, HandlerFailed, KeelError
from .notes import NotePolicy
from .registry import Handler
from .store.base import Key, Store, Write, checked_label_writes, fact_write
from .timeline import Assertion
from .times import Micros, parse_time

Outcome = Literal["applied", "duplicate"]
_tuple_new = tuple.__new__


class EventStore:
    """The `store` a handler receives: DESIGN §3 primitives bound to one event's tenant and provenance.

    Writes are buffered in `writes` (applied by the projector with the event id, all or nothing); reads see
    the graph as it was before this event. Entity and relation names are checked against the catalog.
    The event's provenance is unpacked once here: a handler makes several writes per event. A projector keeps
    one EventStore and binds it to each event in turn (`bind`), rather than building one per event.
    `checks` and `writes` are what compiled projections (keel.projection) use directly.
    """
    __slots__ = ("_by", "_event", "_id", "_known", "_occurred", "_occurred_at", "_recorded", "_source",
                 "_store", "checks", "writes")

    def __init__(self, store: Store, checks: CatalogChecks) -> None:
        self._store = store
        self.checks = checks
        self._known = checks.known          # entity -> type of every entity that passed the checks
        self.writes: list[Write] = []

    def bind(self, event: Event) -> None:
        """Make this the store of `event`, with an empty buffer (the previous buffer belongs to its event)."""
        self._event = event
        self._occurred_at = event.occurred_at
        self._occurred = int(event.occurred_at)
        self._recorded = int(event.recorded_at)
        self._source = event.source
        self._id = event.id
        self._by = event.by
        self.writes: list[Write] = []

    def _tenant(self, tenant: str) -> str:
        if tenant != self._event.tenant:
            raise KeelError(f"handler wrote to tenant {tenant!r} while applying an event of "
                            f"{self._event.tenant!r}")
        return tenant

    def _add(self, key: Key, when: object, value: Any, closed: bool, source: str | None,
             evidence: str | None) -> None:
        """Buffer one write with the event's provenance; `when` is most often the event's own occurred_at.
        The Write and Assertion are built by tuple.__new__ (their NamedTuple __new__ is a Python function)."""
        if when is self._occurred_at:
            point = self._occurred
        else:
            point = int(when) if type(when) is Instant else parse_time(when)
        self.writes.append(_tuple_new(Write, (key, _tuple_new(Assertion, (
            point, value, closed, self._source if source is None else source,
            self._id if evidence is None else evidence, self._recorded, self._by, None)))))

    def upsert_entity(self, tenant: str, type: str, id: str, *, ref: str | None = None, **labels: Any) -> None:
        if tenant != self._event.tenant:
            self._tenant(tenant)
        entity = f"{type}:{id}"
        if entity not in self._known:
            self.checks.entity(entity)
        self.writes += checked_label_writes(entity, ref, labels, self._occurred, self._source, self._id,
                                            self._recorded, self._by)

    def link(self, tenant: str, subject: str, relation: str, object: str, valid_from: object, *,
             source: str | None = None, evidence: str | None = None) -> None:
        if tenant != self._event.tenant:
            self._tenant(tenant)
        self.checks.relation(subject, relation, object)
        self._add(("r", subject, relation, object), valid_from, True, False, source, evidence)

    def unlink(self, tenant: str, subject: str, relation: str, object: str, valid_to: object, *,
               source: str | None = None, evidence: str | None = None) -> None:
        if tenant != self._event.tenant:
            self._tenant(tenant)
        self.checks.relation(subject, relation, object)
        self._add(("r", subject, relation, object), valid_to, None, True, source, evidence)

    def open_fact(self, tenant: str, subject: str, predicate: str, value: Any, *, valid_from: object,
                  source: str | None = None, evidence: str | None = None) -> None:
        if tenant != self._event.tenant:
            self._tenant(tenant)
        if subject not in self._known:
            self.checks.entity(subject)
        self._add(("f", subject, predicate, ""), valid_from, value, False, source, evidence)

    def close_fact(self, tenant: str, subject: str, predicate: str, *, valid_to: object,
                   source: str | None = None, evidence: str | None = None) -> None:
        if tenant != self._event.tenant:
            self._tenant(tenant)
        if subject not in self._known:
            self.checks.entity(subject)
        self._add(("f", subject, predicate, ""), valid_to, None, True, source, evidence)

    def relations(self, tenant: str, entity: str, *, rel: str | None = None, at: object | None = None
                  ) -> list[dict[str, Any]]:
        """Relations valid at `at` (default: the event's occurred_at), as before this event."""
        return self._store.relations(self._tenant(tenant), entity, rel=rel,
                                     at=self._event.occurred_at if at is None else at)

    def facts(self, tenant: str, entity: str, *, at: object | None = None) -> list[dict[str, Any]]:
        """Domain facts valid at `at` (default: the event's occurred_at), as before this event."""
        return self._store.facts(self._tenant(tenant), entity, scopes=("",),
                                 at=self._event.occurred_at if at is None else at)


class CatalogChecks:
    """Checks a handler's entity and relation names against the cartridge, remembering what passed."""

    def __init__(self, cartridge: Cartridge) -> None:
        self.spec = cartridge.spec
        self.known: dict[str, str] = {}      # entity -> its type, for entities that passed (bounded)
        self._relations: set[tuple[str, str, str]] = set()

    def entity(self, entity: str) -> str:
        if entity in self.known:
            return entity
        if not isinstance(entity, str) or not ENTITY.match(entity):
            raise KeelError(f"bad entity {entity!r}: use '<entity type>:<id>'")
        kind = entity.partition(":")[0]
        if kind not in self.spec.entities:
            raise KeelError(f"{entity!r}: {kind!r} is not an entity type of the cartridge")
        if len(self.known) < 100_000:
            self.known[entity] = kind
        return entity

    def relation(self, subject: str, relation: str, object: str) -> None:
        known = self.known
        try:
            if (known.get(subject), relation, known.get(object)) in self._relations:
                return                              # both ends checked before, and this kind of triple too
        except TypeError:                           # an unhashable name: the checks below say what is wrong
            pass
        kinds = (subject.partition(":")[0], relation, object.partition(":")[0])
        if kinds in self._relations:
            self.entity(subject), self.entity(object)
            return
        spec = self.spec.relations.get(relation)
        if spec is None:
            raise KeelError(f"relation {relation!r} is not declared in the cartridge")
        for entity, expected in ((subject, spec.from_), (object, spec.to)):
            if self.entity(entity).partition(":")[0] != expected:
                raise KeelError(f"{relation}: {entity!r} is not a {expected!r}")
        self._relations.add(kinds)


class Projector:
    """Applies events of one cartridge to one store."""

    def __init__(self, cartridge: Cartridge, store: Store, *, allow_global_notes: bool = False) -> None:
        self.cartridge = cartridge
        self.store = store
        self.catalog = Catalog(cartridge)
        self.checks = CatalogChecks(cartridge)
        self.notes = NotePolicy(cartridge, store, allow_global=allow_global_notes)
        self._handlers: dict[str, tuple[Handler, bool]] = {}    # event type -> (handler, declarative)
        self._view = EventStore(store, self.checks)

    def parse(self, raw: bytes | str | dict[str, Any], *, default_recorded_at: Micros | None = None) -> Event:
        return self.catalog.parse(raw, default_recorded_at=default_recorded_at)

    def apply(self, event: Event) -> Outcome:
        """Apply one checked event. Raises EnvelopeRejected (refused note) or HandlerFailed."""
        if self.store.has_event(event.tenant, event.id):
            return "duplicate"
        if event.type == ANNOTATED:
            self._apply_note(event)
            return "applied"
        entry = self._handlers.get(event.type)
        if entry is None:
            found = self.cartridge.registry.handler(event.type)
            if found is None:
                raise EnvelopeRejected(f"no handler for {event.type!r}", event_id=event.id, tenant=event.tenant)
            entry = self._handlers[event.type] = (found, getattr(found, "declarative", False))
        handler, declarative = entry
        view = self._view
        if declarative:
            view.writes = []        # a compiled projection reads the event itself; it uses only checks and writes
        else:
            view.bind(event)
        try:
            handler(event, view)
        except Exception as e:
            raise HandlerFailed(event.id, event.tenant, event.type, e) from e
        self.store.apply_writes(event.tenant, view.writes, event.id)
        return "applied"

    def apply_raw(self, raw: bytes | str | dict[str, Any], *, default_recorded_at: Micros | None = None
                  ) -> tuple[Event, Outcome]:
        event = self.catalog.parse(raw, default_recorded_at=default_recorded_at)
        return event, self.apply(event)

    def _apply_note(self, event: Event) -> None:
        p = event.payload
        try:
            self.notes.check(event.tenant, event.subject, p["scope"], p.get("evidence"),
                             task=p.get("task"), agent=p.get("agent"))
        except KeelError as e:
            raise EnvelopeRejected(str(e), event_id=event.id, tenant=event.tenant) from None
        scope = p["scope"]
        owner = p.get("task") if scope == "task" else p.get("agent") if scope == "agent" else None
        ttl = self.notes.ttl(scope)
        write = fact_write(event.subject, p["predicate"], p["value"], event.occurred_at, False,
                           source=event.source, evidence=p.get("evidence") or event.id,
                           recorded_at=event.recorded_at, by=event.by, scope=scope, owner=owner,
                           expires_at=None if ttl is None else event.occurred_at + ttl)
        if scope == "global":
            self.notes.write_global([write])
            self.store.apply_writes(event.tenant, [], event.id)
        else:
            self.store.apply_writes(event.tenant, [write], event.id)
