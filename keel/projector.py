"""The write path: envelope → checks → cartridge handler → store, idempotent on event id.

A handler sees the graph as it was before its event and writes through an EventStore that fills in
provenance from the event. Its writes are buffered and applied in one `apply_writes` call together
with the event id, so an event is applied entirely or not at all, and applying it twice changes nothing.
"""
from __future__ import annotations

from typing import Any, Literal

from . import reading
from .cartridge import Cartridge
from .envelope import ANNOTATED, ENTITY, ERASED, OFFBOARDED, RETRACTED, Catalog, Event, Instant
from .errors import EnvelopeRejected, HandlerFailed, KeelError
from .limits import ValueRefused, check_value
from .notes import NotePolicy, withdrawal_write
from .registry import Handler
from .store.base import EventId, Key, Store, Write
from .store.writes import checked_label_writes, event_key, fact_write
from .timeline import VOID, Assertion, is_void, new_assertion, superseded, void_of
from .times import Micros, format_time, parse_time

Outcome = Literal["applied", "duplicate"]
_tuple_new = tuple.__new__


class EventStore:
    """The `store` a handler receives: the write primitives (upsert_entity, link, unlink, open_fact, close_fact;
    docs/cartridges.md) and the reads, bound to one event's tenant and provenance.

    Writes are buffered in `writes` (applied by the projector with the event id, all or nothing); reads see
    the graph as it was before this event. Entity and relation names are checked against the catalog.
    The event's provenance is unpacked once here: a handler makes several writes per event. A projector keeps
    one EventStore and binds it to each event in turn (`bind`), rather than building one per event.
    `checks` and `writes` are what compiled projections (keel.projection) use directly.
    """
    __slots__ = ("_by", "_event", "_id", "_known", "_limit", "_occurred", "_occurred_at", "_recorded", "_source",
                 "_store", "checks", "refused", "writes")

    def __init__(self, store: Store, checks: CatalogChecks) -> None:
        self._store = store
        self.checks = checks
        self._known = checks.known          # entity -> type of every entity that passed the checks
        self._limit = checks.value_bytes
        self.writes: list[Write] = []
        self.refused: ValueRefused | None = None    # the first refused value: the whole event is refused

    def bind(self, event: Event) -> None:
        """Make this the store of `event`, with an empty buffer (the previous buffer belongs to its event)."""
        self._event = event
        self._occurred_at = event.occurred_at
        self._occurred = int(event.occurred_at)
        self._recorded = int(event.recorded_at)
        self._source = event.source
        self._id = event.id
        self._by = event.by
        self.writes = []
        self.refused = None

    def check_written(self) -> None:
        """`_check` of every value in the buffer: a compiled projection appends its writes directly."""
        short = self._limit // 3        # a str of at most this many ASCII characters is within the limit
        for key, a in self.writes:
            if a.closed or key[0] not in "lf":
                continue
            value = a.value
            kind = type(value)
            if kind is int or (kind is str and len(value) <= short and value.isascii()) or value is None:
                continue                # check_value's common cases, without its call (hot path)
            self._check(value, f"predicate {key[2]}" if key[0] == "f" else f"label {key[2]}")

    def _check(self, value: Any, what: str) -> None:
        """A written value must be JSON within limits.value_bytes (keel.limits); kept even if the handler
        catches the exception, so a handler cannot drop the refusal and apply the rest of its event."""
        try:
            check_value(value, self._limit, what)
        except ValueRefused as e:
            if self.refused is None:
                self.refused = e
            raise

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
        if ref is not None:
            if not isinstance(ref, str):
                self.refused = ValueRefused(f"ref: {type(ref).__name__} given; ref is a pointer, a string")
                raise self.refused
            self._check(ref, "ref")
        for name, value in labels.items():
            self._check(value, f"label {name}")
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
        if type(predicate) is not str:
            raise KeelError(f"predicate {predicate!r} is not a string")
        self._check(value, f"predicate {predicate}")
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
        return reading.relations(self._store, self._tenant(tenant), entity, rel=rel,
                                 at=self._event.occurred_at if at is None else at)

    def facts(self, tenant: str, entity: str, *, at: object | None = None) -> list[dict[str, Any]]:
        """Domain facts valid at `at` (default: the event's occurred_at), as before this event."""
        return reading.facts(self._store, self._tenant(tenant), entity, scopes=("",),
                             at=self._event.occurred_at if at is None else at)


class CatalogChecks:
    """Checks a handler's entity and relation names against the cartridge, remembering what passed."""

    def __init__(self, cartridge: Cartridge) -> None:
        self.spec = cartridge.spec
        self.value_bytes = cartridge.spec.limits.value_bytes
        self.known: dict[str, str] = {}      # entity -> its type, for entities that passed (bounded)
        self._relations: set[tuple[str, str, str]] = set()

    def entity(self, entity: str, foreign: str | None = None) -> str:
        """`entity` if it is `<type>:<id>` of a type of the cartridge (or, `foreign`, of the other cartridge's
        type `<cartridge>.<type>` a relation end names)."""
        if entity in self.known:
            return entity
        if not isinstance(entity, str) or not ENTITY.match(entity):
            raise KeelError(f"bad entity {entity!r}: use '<entity type>:<id>'")
        kind = entity.partition(":")[0]
        if foreign is not None:
            if kind != foreign.rpartition(".")[2]:
                raise KeelError(f"{entity!r}: {kind!r} is not {foreign!r}")
            return entity
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
        spec = self.spec.relations.get(relation)
        if spec is None:
            raise KeelError(f"relation {relation!r} is not declared in the cartridge")
        for entity, expected in ((subject, spec.from_), (object, spec.to)):
            if self.entity(entity, expected if "." in expected else None).partition(":")[0] != \
                    expected.rpartition(".")[2]:
                raise KeelError(f"{relation}: {entity!r} is not a {expected!r}")
        self._relations.add(kinds)


class Projector:
    """Applies events of one cartridge to one store."""

    def __init__(self, cartridge: Cartridge, store: Store, *, allow_global_notes: bool = False,
                 check_upcasters: bool = False) -> None:
        self.cartridge = cartridge
        self.store = store
        self.catalog = Catalog(cartridge, check_upcasters=check_upcasters)
        self.checks = CatalogChecks(cartridge)
        self.notes = NotePolicy(cartridge, store, allow_global=allow_global_notes)
        self._handlers: dict[str, tuple[Handler, bool]] = {}    # event type -> (handler, declarative)
        self._view = EventStore(store, self.checks)
        self.offboarded: dict[str, dict[str, Any]] = {}    # tenant -> its keel.offboarded receipt, once applied

    def parse(self, raw: bytes | str | dict[str, Any], *, default_recorded_at: Micros | None = None) -> Event:
        return self.catalog.parse(raw, default_recorded_at=default_recorded_at)

    def apply(self, event: Event, origin: str | None = None) -> Outcome:
        """Apply one checked event; `origin` says where it was read (`line 12`, a topic offset), kept with its
        id. An id applied before is a duplicate when the envelope is identical (its content hash), and
        refused otherwise. A recorded_at earlier than the tenant's latest is taken as that latest (the event
        keeps it in `clamped_from`). Raises EnvelopeRejected (refused note, conflict, refused value) or
        HandlerFailed."""
        store = self.store
        gone = self.offboarded.get(event.tenant)
        if gone is not None:
            raise EnvelopeRejected(f"tenant {event.tenant!r} was offboarded at {gone['at']} (keel offboard, receipt "
                                   f"{gone['receipt']}): its events are refused", event_id=event.id, tenant=event.tenant)
        if store.has_event(event.tenant, event.id):
            self._check_identical(event)
            return "duplicate"
        latest = store.latest_recorded(event.tenant)
        if latest is not None and event.recorded_at < latest:
            event.clamp_recorded_at(latest)
        key = event_key(event.id, f"{event.content_hash()} {origin or 'earlier in the log'}", int(event.recorded_at))
        if event.type == ANNOTATED:
            self._apply_note(event, key)
            return "applied"
        if event.type == OFFBOARDED:         # a receipt: the tenant's later events are refused (its graph is
            self.offboarded[event.tenant] = {    # dropped by whoever builds it: keel/embedded.py, workers/replay.py)
                "at": format_time(event.occurred_at), "keys": event.payload.get("keys"), "receipt": event.id}
            store.apply_writes(event.tenant, [], key)
            return "applied"
        if event.type == ERASED:             # a receipt: the keys are gone, reads already show the mask
            store.apply_writes(event.tenant, self._erasure_writes(event), key)
            return "applied"
        superseding = [] if event.supersedes is None else self._supersede(event)
        if event.type == RETRACTED:
            store.apply_writes(event.tenant, superseding, key)
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
            view.refused = None
        else:
            view.bind(event)
        try:
            handler(event, view)
            if declarative:
                view.check_written()
        except Exception as e:
            if view.refused is None:
                raise HandlerFailed(event.id, event.tenant, event.type, e) from e
        if view.refused is not None:
            raise EnvelopeRejected(f"handler {getattr(handler, '__name__', '?')} for {event.type} wrote "
                                   f"{view.refused}", event_id=event.id, tenant=event.tenant)
        store.apply_writes(event.tenant, superseding + view.writes if superseding else view.writes, key)
        return "applied"

    def _erasure_writes(self, event: Event) -> list[Write]:
        """A keel.erased receipt on an entity of the graph: the fact `keel.erased` (the receipt's id and key
        count) from the erasure's time, so that context and history say when its data subject was erased."""
        if not reading.exists(self.store, event.tenant, event.subject):
            return []
        return [fact_write(event.subject, ERASED, {"receipt": event.id, "keys": event.payload.get("keys")},
                           event.occurred_at, False, source=event.source, evidence=event.id,
                           recorded_at=event.recorded_at, by=event.by)]

    def _supersede(self, event: Event) -> list[Write]:
        """The writes that supersede every domain version resting on the event `event` corrects or retracts,
        as of `event`'s recorded_at. At each point where that event's assertion is still the winner, the
        assertion before it at that point is written again (restoring what was believed without it) or, with
        none before it, a void (the point then counts for nothing). Raises EnvelopeRejected."""
        target, tenant = event.supersedes, event.tenant
        what = "retract" if event.type == RETRACTED else "correct"
        if not self.store.has_event(tenant, target):
            raise EnvelopeRejected(f"cannot {what} event {target!r}: it is not an applied event of tenant "
                                   f"{tenant!r} (ids are per tenant; a rejected event needs no correction)",
                                   event_id=event.id, tenant=tenant)
        writes: list[Write] = []
        for key, assertions in self.store.resting_on(tenant, target):
            if any(is_void(a) and a.value[VOID] == target for a in assertions):
                raise EnvelopeRejected(f"cannot {what} event {target!r}: it was already retracted or corrected",
                                       event_id=event.id, tenant=tenant)
            for point, again in superseded(assertions, target):     # the rule: keel.timeline.superseded
                writes.append(_tuple_new(Write, (key, new_assertion(
                    point, void_of(target, retraction=event.type == RETRACTED), True, event.source, event.id, int(event.recorded_at), event.by))))
                if again is not None and not is_void(again):
                    writes.append(_tuple_new(Write, (key, new_assertion(
                        point, again.value, again.closed, event.source, event.id, int(event.recorded_at), event.by,
                        again.expires_at))))
        return writes

    def _check_identical(self, event: Event) -> None:
        """An id applied before must name the same envelope (ids are idempotency keys)."""
        mark = self.store.event_mark(event.tenant, event.id)
        if mark is None:
            return                                  # applied before marks were kept: nothing to compare
        digest, _, where = mark.partition(" ")
        if digest != event.content_hash():
            raise EnvelopeRejected(f"id {event.id!r} was first seen {where or 'earlier in the log'} with "
                                   f"different content; an id names one envelope (send a new id, or "
                                   f"`corrects` to replace that event)", event_id=event.id, tenant=event.tenant)

    def apply_raw(self, raw: bytes | str | dict[str, Any], *, default_recorded_at: Micros | None = None,
                  origin: str | None = None) -> tuple[Event, Outcome]:
        event = self.catalog.parse(raw, default_recorded_at=default_recorded_at)
        return event, self.apply(event, origin)

    def _apply_note(self, event: Event, key: EventId) -> None:
        p = event.payload
        if p.get("withdraw"):
            self._apply_withdrawal(event, key)
            return
        try:
            check_value(p["value"], self.checks.value_bytes, f"note {p['predicate']}")
        except ValueRefused as e:
            raise EnvelopeRejected(str(e), event_id=event.id, tenant=event.tenant) from None
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
            self.store.apply_writes(event.tenant, [], key)
        else:
            self.store.apply_writes(event.tenant, [write], key)

    def _apply_withdrawal(self, event: Event, key: EventId) -> None:
        """A keel.annotated with `withdraw: true`: the same checks as the tool's (keel.tools.Tools.annotate),
        on the graph as before this event, then an end on the note's timeline at occurred_at."""
        p = event.payload
        try:
            self.notes.check(event.tenant, event.subject, p["scope"], p.get("evidence"),
                             task=p.get("task"), agent=p.get("agent"))
            note, _ = self.notes.withdrawable(event.tenant, event.subject, p["predicate"], p["scope"],
                                              task=p.get("task"), agent=p.get("agent"), by=event.by,
                                              at=int(event.occurred_at))
        except KeelError as e:
            raise EnvelopeRejected(str(e), event_id=event.id, tenant=event.tenant) from None
        self.store.apply_writes(event.tenant, [withdrawal_write(
            note, int(event.occurred_at), event_id=event.id, reason=p.get("reason"), source=event.source,
            evidence=p.get("evidence"), recorded_at=int(event.recorded_at), by=event.by)], key)
