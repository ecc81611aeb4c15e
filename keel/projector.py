"""The write path: envelope → checks → cartridge handler → store, idempotent on event id.

A handler sees the graph as it was before its event and writes through an EventStore that fills in
provenance from the event. Its writes are buffered and applied in one `apply_writes` call together
with the event id, so an event is applied entirely or not at all, and applying it twice changes nothing.
"""
from __future__ import annotations

from typing import Any, Literal

from .cartridge import Cartridge
from .envelope import ANNOTATED, Catalog, Event
from .errors import EnvelopeRejected, HandlerFailed, KeelError
from .notes import NotePolicy
from .store.base import Store, Write, fact_write, label_writes, relation_write
from .times import Micros

Outcome = Literal["applied", "duplicate"]


class EventStore:
    """The `store` a handler receives: DESIGN §3 primitives bound to one event's tenant and provenance."""
    __slots__ = ("_store", "_event", "_spec", "writes")

    def __init__(self, store: Store, event: Event, cartridge: Cartridge) -> None:
        self._store = store
        self._event = event
        self._spec = cartridge.spec
        self.writes: list[Write] = []

    def _tenant(self, tenant: str) -> str:
        if tenant != self._event.tenant:
            raise KeelError(f"handler wrote to tenant {tenant!r} while applying an event of "
                            f"{self._event.tenant!r}")
        return tenant

    def _prov(self, source: str | None, evidence: str | None) -> dict[str, Any]:
        e = self._event
        return {"source": e.source if source is None else source, "evidence": e.id if evidence is None else evidence,
                "recorded_at": e.recorded_at, "by": e.by}

    def _type(self, entity: str, expected: str | None = None) -> None:
        kind = entity.partition(":")[0]
        if kind not in self._spec.entities:
            raise KeelError(f"{entity!r}: {kind!r} is not an entity type of the cartridge")
        if expected is not None and kind != expected:
            raise KeelError(f"{entity!r}: expected a {expected!r}")

    def _relation(self, subject: str, relation: str, object: str) -> None:
        spec = self._spec.relations.get(relation)
        if spec is None:
            raise KeelError(f"relation {relation!r} is not declared in the cartridge")
        self._type(subject, spec.from_)
        self._type(object, spec.to)

    def upsert_entity(self, tenant: str, type: str, id: str, *, ref: str | None = None, **labels: Any) -> None:
        self._tenant(tenant)
        self._type(f"{type}:{id}")
        self.writes += label_writes(f"{type}:{id}", ref, labels, valid_from=self._event.occurred_at,
                                    **self._prov(None, None))

    def link(self, tenant: str, subject: str, relation: str, object: str, valid_from: object, *,
             source: str | None = None, evidence: str | None = None) -> None:
        self._tenant(tenant)
        self._relation(subject, relation, object)
        self.writes.append(relation_write(subject, relation, object, valid_from, False, **self._prov(source, evidence)))

    def unlink(self, tenant: str, subject: str, relation: str, object: str, valid_to: object, *,
               source: str | None = None, evidence: str | None = None) -> None:
        self._tenant(tenant)
        self._relation(subject, relation, object)
        self.writes.append(relation_write(subject, relation, object, valid_to, True, **self._prov(source, evidence)))

    def open_fact(self, tenant: str, subject: str, predicate: str, value: Any, *, valid_from: object,
                  source: str | None = None, evidence: str | None = None) -> None:
        self._tenant(tenant)
        self._type(subject)
        self.writes.append(fact_write(subject, predicate, value, valid_from, False, **self._prov(source, evidence)))

    def close_fact(self, tenant: str, subject: str, predicate: str, *, valid_to: object,
                   source: str | None = None, evidence: str | None = None) -> None:
        self._tenant(tenant)
        self._type(subject)
        self.writes.append(fact_write(subject, predicate, None, valid_to, True, **self._prov(source, evidence)))

    def relations(self, tenant: str, entity: str, *, rel: str | None = None, at: object | None = None
                  ) -> list[dict[str, Any]]:
        """Relations valid at `at` (default: the event's occurred_at), as before this event."""
        return self._store.relations(self._tenant(tenant), entity, rel=rel,
                                     at=self._event.occurred_at if at is None else at)

    def facts(self, tenant: str, entity: str, *, at: object | None = None) -> list[dict[str, Any]]:
        """Domain facts valid at `at` (default: the event's occurred_at), as before this event."""
        return self._store.facts(self._tenant(tenant), entity, scopes=("",),
                                 at=self._event.occurred_at if at is None else at)


class Projector:
    """Applies events of one cartridge to one store."""

    def __init__(self, cartridge: Cartridge, store: Store, *, allow_global_notes: bool = False) -> None:
        self.cartridge = cartridge
        self.store = store
        self.catalog = Catalog(cartridge)
        self.notes = NotePolicy(cartridge, store, allow_global=allow_global_notes)

    def parse(self, raw: bytes | str | dict[str, Any], *, default_recorded_at: Micros | None = None) -> Event:
        return self.catalog.parse(raw, default_recorded_at=default_recorded_at)

    def apply(self, event: Event) -> Outcome:
        """Apply one checked event. Raises EnvelopeRejected (refused note) or HandlerFailed."""
        if self.store.has_event(event.tenant, event.id):
            return "duplicate"
        if event.type == ANNOTATED:
            self._apply_note(event)
            return "applied"
        handler = self.cartridge.registry.handler(event.type)
        if handler is None:
            raise EnvelopeRejected(f"no handler for {event.type!r}", event_id=event.id, tenant=event.tenant)
        view = EventStore(self.store, event, self.cartridge)
        try:
            handler(event, view)
        except Exception as e:  # noqa: BLE001 - a handler bug becomes a dead letter, never a crash
            raise HandlerFailed(event.id, event.tenant, event.type, e) from e
        self.store.apply_writes(event.tenant, view.writes, event.id)
        return "applied"

    def apply_raw(self, raw: bytes | str | dict[str, Any], *, default_recorded_at: Micros | None = None
                  ) -> tuple[Event, Outcome]:
        event = self.parse(raw, default_recorded_at=default_recorded_at)
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
