"""The five tools an agent has: context, history, search, annotate, related. The read path is
tool → store; annotate goes tool → policy → log → projector → store, and returns what the store shows.

`Tools` is the public Python API (docs/python.md): get one from `keel.open(...).tools(tenant=...)`. The MCP
server and the CLI call these same methods, so a method's result is the MCP tool's result object.
"""
from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar, cast

from . import reading
from .cartridge import Cartridge
from .changes import parse_cursor, read_changes
from .envelope import ANNOTATED, MAX_REASON
from .errors import NoteRefused, UnknownEntity, UnknownTenant, UsageError, WriteTimeout
from .eventlog import EventLog
from .identifiers import TENANT
from .notes import (
    NotePolicy,
    anonymous,
    check_note_name,
    note_id,
    note_key,
    withdrawal_id,
    withdrawal_of,
)
from .results import (
    AnnotateResult,
    Change,
    ChangesResult,
    ContextResult,
    Fact,
    FactVersion,
    HistoryResult,
    Known,
    LabelVersion,
    RelatedResult,
    Relation,
    RelationVersion,
    Scope,
    SearchHit,
    SearchResult,
)
from .rules import verdict
from .search import SearchIndex, SearchOptions
from .store.base import GLOBAL_TENANT, Freshness, Store, ViewRequest, of_relation
from .store.writes import Key, scope_key
from .timeline import Assertion, Version
from .times import Micros, format_time, now_micros, parse_time
from .tool_args import (
    DEFAULT_RESULTS,
    MAX_RESULTS,
    Time,
    clip,
    count,
    entity_arg,
    flag,
    given,
    history_args,
    note_value,
    opt_text,
    time_arg,
)

if TYPE_CHECKING:
    from .log_lag import LogLag

NO_VALUE: Any = type("NoValue", (), {"__repr__": lambda self: "NO_VALUE"})()   # annotate without a value
MAX_TEXT = 4096

SearchIndexes = dict[str, tuple[object, SearchIndex]]     # tenant -> (the store's search_version, the index)
_R = TypeVar("_R", bound=Known)


class Tools:
    """The five tools bound to one tenant and one caller identity (agent, task).

    Build one with `Graph.tools` (keel.connect): the graph shares its search indexes and its locks with every
    Tools it makes (`read_lock` is held by the readers, `write_lock` by annotate; none by default)."""

    def __init__(self, cartridge: Cartridge, store: Store, tenant: str, agent: str | None = None,
                 task: str | None = None, *, log: EventLog | None = None, allow_global_notes: bool = False,
                 clock: Callable[[], Micros] = now_micros, search_indexes: SearchIndexes | None = None,
                 read_lock: AbstractContextManager[object] | None = None,
                 write_lock: AbstractContextManager[object] | None = None,
                 lag: LogLag | None = None) -> None:
        if not isinstance(tenant, str) or not TENANT.fullmatch(tenant):
            raise UsageError(f"bad tenant {tenant!r}")
        self.cartridge = cartridge
        self.store = store
        self.tenant = tenant
        self.agent = agent
        self.task = task
        self.log = log
        self.clock = clock
        self.policy = NotePolicy(cartridge, store, allow_global=allow_global_notes)
        self._indexes: SearchIndexes = {} if search_indexes is None else search_indexes
        self._reading: AbstractContextManager[object] = read_lock if read_lock is not None else nullcontext()
        self._writing: AbstractContextManager[object] = write_lock if write_lock is not None else nullcontext()
        self._lag = lag          # Redis mode: the lag measured from the log's end when an answer is made

    # ---- readers ----------------------------------------------------------------------------

    def context(self, entity: str, *, at: Time = None, known_at: Time = None) -> ContextResult:
        """An entity as of `at` (world time) and `known_at` (Keel's knowledge): labels, facts, relations, rules."""
        with self._reading:
            return self._context(entity, at, known_at)

    def _context(self, entity: str, at: Time, known_at: Time) -> ContextResult:
        entity = self._entity_arg(entity)
        t, k = time_arg(at, "at"), time_arg(known_at, "known_at")
        entity_type = entity.partition(":")[0]
        rules = self.cartridge.rules_of(entity_type)
        scopes = self.policy.visible_scopes(task=self.task, agent=self.agent)
        when = t if t is not None else self.clock()
        requests = [ViewRequest(self.tenant, entity, scopes),           # one request with the notes
                    *self.policy.global_note_views(entity_type, [r.name for r in rules])]
        view, *notes = reading.views(self.store, requests, at=when, known_at=k)
        if view is None:
            raise self._unknown(entity)
        info = view.info
        facts = view.facts + self.policy.global_notes(notes)
        declared = self.cartridge.relations_of(entity_type)
        verdicts = {r.name: _owned(r.describe()) if r.program is None else
                    {**_owned(r.describe()), **verdict(r, view.facts, info.labels, view.relations, entity, when,
                                                       declared)}
                    for r in rules}
        result: ContextResult = {
            "entity": entity, "type": info.type, "ref": info.ref, "labels": _owned(info.labels),
            "at": format_time(t), "known_at": format_time(k), "facts": cast(list[Fact], _owned_values(facts)),
            "relations": cast(list[Relation], view.relations), "rules": verdicts, "known_through": None}
        return self._fresh(result, view.freshness, k)

    def history(self, entity: str | None = None, predicate: str | None = None, *, known_at: Time = None,
                since: Time = None, type: str | None = None, cursor: str | None = None,
                limit: int | None = None) -> HistoryResult | ChangesResult:
        """Every version ever recorded (by `known_at`, when given) of each of an entity's timelines, closed and
        superseded ones included, each with its evidence and what superseded it: `versions` (facts and the
        notes the caller may see, by predicate then valid_from), `labels` (by label, `ref` included) and
        `relations` (either direction, by relation, subject, object). `predicate` keeps the timelines of
        that name (a fact predicate, a label or a relation).

        Without an entity: the tenant's changes recorded after `since` (or from a previous answer's `cursor`),
        oldest first, at most `limit` (default 100, at most 500), of entities of `type` when given; `more` says
        whether the log held more then, and `cursor` continues exactly after this answer, now or later
        (keel/changes.py; docs/semantics.md, "What changed since"). Empty arguments count as absent
        (keel/tool_args.py)."""
        with self._reading:
            args = history_args(entity, predicate, known_at, since, type, cursor, limit)
            if args.entity is None:
                return self._changes(args.since, args.type, args.cursor, args.limit)
            return self._history(args.entity, args.predicate, args.known_at)

    def _changes(self, since: Time, type: str | None, cursor: str | None, limit: int) -> ChangesResult:
        s, after = time_arg(since, "since"), parse_cursor(cursor)
        if s is None and after is None:
            raise UsageError("since: a recorded time (RFC 3339 or a date), e.g. the known_through of your last "
                             "answer; or cursor: a previous changes answer's cursor")
        if type is not None:
            self._name_arg("type", "an entity type", type, self.cartridge.spec.entities)
        scopes = set(self.policy.visible_scopes(task=self.task, agent=self.agent))
        page = read_changes(self.store, self.tenant, since=s, after=after, limit=limit, type=type, scopes=scopes)
        if not page.rows and page.through is None:      # nothing applied for it: is the tenant known at all?
            self._require_tenant()                       # (asked only then: one round trip less per page)
        result: ChangesResult = {"since": format_time(s), "type": type, "changes": cast(list[Change], page.rows),
                                 "cursor": page.cursor, "more": page.more, "known_through": None}
        return self._fresh(result, Freshness(page.through))

    def _history(self, entity: str, predicate: str | None, known_at: Time) -> HistoryResult:
        entity = self._entity_arg(entity, foreign=True)
        k = time_arg(known_at, "known_at")
        predicate = opt_text(predicate, "predicate")
        self._require(entity, k)
        scopes = self.policy.visible_scopes(task=self.task, agent=self.agent)
        versions = self._with_withdrawals(entity, reading.history(self.store, self.tenant, entity, predicate=predicate,
                                                                  known_at=k, scopes=scopes), k)
        keys = self.store.keys(self.tenant, entity)
        labels = sorted(key for key in keys if key[0] == "l" and predicate in (None, key[2]))
        relations = sorted((key for key in keys if key[0] == "r" and predicate in (None, key[2])),
                           key=lambda key: (key[2], key[1], key[3]))
        found = self.store.recorded_versions_many(self.tenant, labels + relations, k) if labels or relations else []
        label_versions = [{"label": key[2], "value": _own(v.assertion.value), **_version(v, by)}
                          for key, recorded in zip(labels, found) for v, by in recorded]
        relation_versions = [{"subject": key[1], "relation": key[2], "object": key[3], **_version(v, by)}
                             for key, recorded in zip(relations, found[len(labels):]) for v, by in recorded]
        if predicate is not None and not (versions or label_versions or relation_versions):
            facts = {v["predicate"]
                     for v in reading.history(self.store, self.tenant, entity, known_at=k, scopes=scopes)}
            names = sorted(facts | {key[2] for key in keys if key[0] in "lr"})
            raise UsageError(f"predicate: {clip(predicate)} is not a fact, label or relation of {entity}; use one "
                             f"of {', '.join(names) or '(none)'}")
        result: HistoryResult = {
            "entity": entity, "versions": cast(list[FactVersion], _owned_values(versions)),
            "labels": cast(list[LabelVersion], label_versions),
            "relations": cast(list[RelationVersion], relation_versions), "known_through": None}
        return self._fresh(result, known_at=k)

    def search(self, query: str, *, type: str | None = None, limit: int | None = DEFAULT_RESULTS, at: Time = None,
               known_at: Time = None) -> SearchResult:
        """BM25 and a semantic signal, fused, over the tenant's entity ids, types, labels and the notes this
        caller may see, as they were at `at` (world time, default now) as known at `known_at` (default now); at
        most `limit` hits (default 10), each saying which signal found it (`found_by`)."""
        with self._reading:
            return self._search(query, given(type), count(limit, "limit", DEFAULT_RESULTS, MAX_RESULTS), at,
                                known_at)

    def _search(self, query: str, type: str | None, limit: int, at: Time, known_at: Time) -> SearchResult:
        if not isinstance(query, str) or not query.strip():
            raise UsageError("query: give one or more words, e.g. a name, a product or an entity type")
        if len(query) > MAX_TEXT:
            raise UsageError(f"query: at most {MAX_TEXT} characters")
        if type is not None:
            self._name_arg("type", "an entity type", type, self.cartridge.spec.entities)
        t, k = time_arg(at, "at"), time_arg(known_at, "known_at")
        results = self._search_index().search(
            query, at=t if t is not None else self.clock(), known_at=k, type=type, limit=limit,
            scopes=self.policy.visible_scopes(task=self.task, agent=self.agent))
        for hit in results:
            hit["labels"] = _owned(hit["labels"])
        if results:
            message = f"{len(results)} result{'s' if len(results) != 1 else ''}"
        else:
            self._require_tenant()
            where = f"{type} entities" if type else "entities"
            message = (f"no {where} match {query!r}; try broader or fewer words (a name, a product, a label) "
                       f"or an entity type such as {', '.join(sorted(self.cartridge.spec.entities))}")
        result: SearchResult = {"query": query, "results": cast(list[SearchHit], results), "message": message,
                                "known_through": None}
        return self._fresh(result, known_at=k)

    def related(self, entity: str, relation: str | None = None, *, at: Time = None,
                known_at: Time = None) -> RelatedResult:
        """Relations valid at `at` with the entity at either end, as known at `known_at`."""
        with self._reading:
            return self._related(entity, relation, at, known_at)

    def _related(self, entity: str, relation: str | None, at: Time, known_at: Time) -> RelatedResult:
        entity = self._entity_arg(entity, foreign=True)
        relation = opt_text(relation, "relation")
        if relation is not None:
            self._name_arg("relation", "a relation", relation, self.cartridge.spec.relations)
        t, k = time_arg(at, "at"), time_arg(known_at, "known_at")
        view = reading.view(self.store, self.tenant, entity, at=t if t is not None else self.clock(), known_at=k,
                            parts="r")
        if view is None:                    # the view tells an unknown entity: no existence check first
            raise self._unknown(entity)
        result: RelatedResult = {"entity": entity, "relations": cast(list[Relation], of_relation(view.relations,
                                                                                                  relation)),
                                 "known_through": None}
        return self._fresh(result, view.freshness, k)

    # ---- the writer -------------------------------------------------------------------------

    def annotate(self, entity: str, predicate: str, value: Any = NO_VALUE, scope: Scope | None = None, *,
                 evidence: str | None = None, withdraw: bool = False, reason: str | None = None) -> AnnotateResult:
        """Write a note (agent memory) as a keel.annotated event; returns the fact as the graph shows it.
        Its task and agent are the caller's binding, never an argument. `withdraw=True` (no value, an optional
        `reason`) closes the caller's own note of that name and scope on the entity now instead, as a
        keel.annotated event with `withdraw: true`; the result's fact is the closed version with `withdrawn`.
        Empty arguments count as absent (keel/tool_args.py): a null or `""` value is no value."""
        withdraw = flag(withdraw, "withdraw", "close your note of that name")
        value, scope, evidence, reason = (NO_VALUE if given(value) is None else value), given(scope), \
            given(evidence), given(reason)
        if scope is None:
            raise UsageError("scope: required, one of tenant, task, agent, global")
        with self._writing:
            if withdraw:
                if value is not NO_VALUE:
                    raise UsageError("value: a withdrawal takes no value (withdraw: true closes your note)")
                return self._withdraw(entity, predicate, scope, evidence, reason)
            if value is NO_VALUE:
                raise UsageError("value: required, the note (text, number or JSON)")
            if reason is not None:
                raise UsageError("reason: only a withdrawal (withdraw: true) has a reason")
            return self._annotate(entity, predicate, value, scope, evidence)

    def _annotate(self, entity: str, predicate: str, value: Any, scope: Scope,
                  evidence: str | None) -> AnnotateResult:
        entity = self._entity_arg(entity, notes_on=scope == "global")
        predicate = check_note_name(predicate)
        evidence = opt_text(evidence, "evidence")
        task = self.task
        value = note_value(value, self.cartridge.spec.limits.value_bytes)     # the caller's object stays theirs
        if self.log is None:
            raise UsageError("this Tools instance has no event log to write notes to")
        self._require_tenant()
        self.policy.check(self.tenant, entity, scope, evidence, task=task, agent=self.agent)
        now = self.clock()
        payload: dict[str, Any] = {"predicate": predicate, "value": value, "scope": scope}
        if evidence:
            payload["evidence"] = evidence
        if scope == "task":
            payload["task"] = task
        if self.agent:
            payload["agent"] = self.agent
        stamp = format_time(now)
        event_id = note_id(self.tenant, self.agent, task if scope == "task" else None, entity, predicate, value,
                           scope, evidence, now, after=self._last_withdrawal(entity, predicate, scope))
        envelope = {"id": event_id, "tenant": self.tenant, "type": ANNOTATED,
                    "subject": entity, "occurred_at": stamp, "recorded_at": stamp, "source": "keel.annotate",
                    "payload": payload}
        if self.agent:
            envelope["by"] = _by(self.agent)
        try:
            self.log.append(envelope)
        except WriteTimeout as e:        # in the log: it will be applied; a retry of this call is the same note
            pending: AnnotateResult = {
                "applied": False, "event_id": event_id, "message": f"{e}. The note is in the log and will be "
                f"applied; calling again with the same arguments does not write it twice.", "known_through": None}
            return self._fresh(pending)
        owner = task if scope == "task" else self.agent if scope == "agent" else None
        where = GLOBAL_TENANT if scope == "global" else self.tenant
        mine = [f for f in reading.history(self.store, where, entity, predicate=predicate,
                                           scopes=[scope_key(scope, owner)])
                if f["value"] == value and f.get("evidence") == (evidence or event_id)]    # a retry: the first call's
        if not mine:
            raise UsageError(f"note {event_id} was logged but is not in the graph")
        exact = [f for f in mine if f["valid_from"] == stamp and f["recorded_at"] == stamp]
        fact = _owned_values([(exact or mine)[-1]])[0]
        result: AnnotateResult = {"fact": cast(FactVersion, anonymous(fact) if scope == "global" else fact),
                                  "applied": True, "event_id": event_id, "known_through": None}
        return self._fresh(result)

    def _withdraw(self, entity: str, predicate: str, scope: Scope, evidence: str | None,
                  reason: object) -> AnnotateResult:
        entity = self._entity_arg(entity, notes_on=scope == "global")
        predicate = check_note_name(predicate)
        evidence = opt_text(evidence, "evidence")
        if reason is not None and (not isinstance(reason, str) or len(reason) > MAX_REASON):
            raise UsageError(f"reason: expected a string of at most {MAX_REASON} characters, got {clip(reason)}")
        if self.log is None:
            raise UsageError("this Tools instance has no event log to write notes to")
        self._require_tenant()
        task = self.task if scope == "task" else None
        self.policy.check(self.tenant, entity, scope, evidence, task=task, agent=self.agent)
        by = _by(self.agent)
        now = self.clock()
        try:
            key, target = self.policy.withdrawable(self.tenant, entity, predicate, scope, task=task,
                                                   agent=self.agent, by=by, at=now)
        except NoteRefused:
            done = self._withdrawn_before(entity, predicate, scope, by)     # a retry of a withdrawal applied
            if done is None:
                raise
            key, target = done
        assert by is not None       # withdrawable refuses a caller bound to no agent
        event_id = withdrawal_id(self.tenant, by, key, target)
        if not self.store.has_event(self.tenant, event_id):
            payload: dict[str, Any] = {"predicate": predicate, "scope": scope, "withdraw": True}
            if reason:
                payload["reason"] = reason
            if evidence:
                payload["evidence"] = evidence
            if task:
                payload["task"] = task
            if self.agent:
                payload["agent"] = self.agent
            stamp = format_time(now)
            try:
                self.log.append({"id": event_id, "tenant": self.tenant, "type": ANNOTATED, "subject": entity,
                                 "occurred_at": stamp, "recorded_at": stamp, "source": "keel.annotate",
                                 "by": by, "payload": payload})
            except WriteTimeout as e:
                pending: AnnotateResult = {
                    "applied": False, "event_id": event_id, "message": f"{e}. The withdrawal is in the log and "
                    f"will be applied; calling again with the same arguments does not write it twice.",
                    "known_through": None}
                return self._fresh(pending)
        rows = [r for r in reading.history(self.store, self.tenant, entity, predicate=predicate, scopes=[key[3]])
                if r["valid_from"] == format_time(target.assertion.point)
                and r["recorded_at"] == format_time(target.assertion.recorded_at)]
        closed = self._with_withdrawals(entity, rows, None)
        if not closed or "withdrawn" not in closed[-1]:
            raise UsageError(f"withdrawal {event_id} was logged but is not in the graph")
        result: AnnotateResult = {"fact": cast(FactVersion, _owned_values(closed[-1:])[0]), "applied": True,
                                  "event_id": event_id, "known_through": None}
        return self._fresh(result)

    def _last_withdrawal(self, entity: str, predicate: str, scope: str) -> str | None:
        """The event id of the latest withdrawal on the caller's note timeline (None: never withdrawn; a global
        note is not withdrawn): part of a note's id, so the same note written again after its withdrawal is a
        new note, while a retry of that write is the same one."""
        if scope == "global":
            return None
        key = note_key(entity, predicate, scope, task=self.task, agent=self.agent)
        [assertions] = self.store.assertions_many(self.tenant, [key])
        ends = [w["event_id"] for w in map(withdrawal_of, assertions) if w is not None]
        return ends[-1] if ends else None

    def _withdrawn_before(self, entity: str, predicate: str, scope: str, by: str | None) -> tuple[Key, Version] | None:
        """(timeline, version) when the latest version of the caller's note was closed by this caller's
        withdrawal of it, the one a retry of the call would write: the retry then answers as the first call."""
        if by is None or scope == "global":
            return None
        key = note_key(entity, predicate, scope, task=self.task, agent=self.agent)
        [versions] = self.store.versions_many(self.tenant, [key], None)
        if not versions:
            return None
        last = versions[-1]
        return (key, last) if self.store.has_event(self.tenant, withdrawal_id(self.tenant, by, key, last)) else None

    def _with_withdrawals(self, entity: str, rows: list[dict[str, Any]], known_at: Micros | None
                          ) -> list[dict[str, Any]]:
        """History's fact versions, a note version closed by a withdrawal (recorded by `known_at`) with
        `withdrawn`: when, by whom and why (keel.notes.withdrawal_of). Reads the ended notes' timelines once."""
        ended = [r for r in rows if r["scope"] in ("tenant", "task", "agent") and r["valid_to"] is not None
                 and r["valid_to"] != r["expires_at"]]     # a withdrawn version ended before its expiry
        if not ended:
            return rows
        keyed = [(note_key(entity, r["predicate"], r["scope"], task=self.task, agent=self.agent), r) for r in ended]
        keys = sorted({key for key, _ in keyed})
        last: dict[tuple[Key, Micros], Assertion] = {}
        for key, assertions in zip(keys, self.store.assertions_many(self.tenant, keys)):
            for a in assertions:            # by point, then log order: the last one of a point wins it
                if known_at is None or a.recorded_at <= known_at:
                    last[(key, a.point)] = a
        for key, row in keyed:
            end = last.get((key, parse_time(row["valid_to"])))
            withdrawn = None if end is None else withdrawal_of(end)
            if withdrawn is not None:
                row["withdrawn"] = withdrawn
        return rows

    # ---- helpers ----------------------------------------------------------------------------

    def _fresh(self, result: _R, freshness: Freshness | None = None, known_at: Micros | None = None) -> _R:
        """The result with `known_through`, what the answer is based on: the latest recorded_at applied for the
        tenant, or with `known_at` K before it, K itself (the answer is the state after exactly the events
        recorded by K), then `applied_through` (the latest recorded_at applied) whenever K is given; and, where
        workers apply a log, `lag`: records of the tenant's partition Redis does not hold yet, measured from the log's
        end when the answer is made (keel/log_lag.py; with `lag_measured_at` when Kafka has not answered since),
        else as the workers stored it at their last commit. Freshness from the read that made the result when the
        backend returned it there."""
        f = freshness if freshness is not None else self.store.freshness(self.tenant)
        applied = f.known_through
        through = known_at if known_at is not None and applied is not None and known_at < applied else applied
        result["known_through"] = format_time(through)
        if known_at is not None:
            result["applied_through"] = format_time(applied)
        measured, read_at = self._lag.measure(self.tenant) if self._lag is not None else (None, None)
        if measured is not None and read_at is not None and self._lag is not None:
            result["lag"] = measured
            if self.clock() - read_at > self._lag.stale_after() * 1e6:
                result["lag_measured_at"] = format_time(read_at) or ""      # Kafka did not answer since
        elif f.lag is not None:
            result["lag"] = f.lag
        return result

    def _require(self, entity: str, known_at: Micros | None) -> None:
        if not reading.exists(self.store, self.tenant, entity, known_at=known_at):
            raise self._unknown(entity)

    def _require_tenant(self) -> None:
        if not self.store.has_tenant(self.tenant):
            raise UnknownTenant(self.tenant)

    def _unknown(self, entity: str) -> UnknownEntity | UnknownTenant:
        """What a missing entity means: an unknown tenant when the tenant has nothing at all."""
        return UnknownEntity(self.tenant, entity) if self.store.has_tenant(self.tenant) else UnknownTenant(self.tenant)

    def _entity_arg(self, entity: object, notes_on: bool = False, foreign: bool = False) -> str:
        """An entity argument: `<type>:<id>` of an entity type of the cartridge, else a usage error listing the
        types (the same for every tool). `notes_on`: global notes also attach to type:<t> and rule:<r>, which
        the memory policy checks. `foreign`: history and related also read the other cartridges' entities
        that this cartridge's relations end at (`<cartridge>.<type>` ends), by their own ids."""
        entity = entity_arg(entity)
        kind = entity.partition(":")[0]
        types = self.cartridge.spec.entities
        if foreign and kind in self.cartridge.foreign_types():
            return entity
        if kind not in types and not (notes_on and kind in ("type", "rule")):
            where = " (global notes attach to type:<entity type> or rule:<rule name>)" if kind in ("type", "rule") \
                else ""
            raise UsageError(f"entity {clip(entity)}: {clip(kind)} is not an entity type of the cartridge; use "
                             f"one of {', '.join(sorted(types))}{where}")
        return entity

    @staticmethod
    def _name_arg(arg: str, what: str, name: object, names: Iterable[str]) -> None:
        """A name the cartridge declares, or a usage error listing the names it does."""
        if not isinstance(name, str) or name not in names:
            raise UsageError(f"{arg}: {clip(name)} is not {what} of the cartridge; use one of "
                             f"{', '.join(sorted(names))}")

    def _search_index(self) -> SearchIndex:
        """The tenant's index, rebuilt when the store's search_version moved (shared by a graph's Tools: it
        depends on the tenant only, the caller's scopes filter at query time)."""
        version = self.store.search_version(self.tenant)
        cached = self._indexes.get(self.tenant)
        if cached is None or version is None or cached[0] != version:
            entities = self.store.search_entities(self.tenant)
            if self.cartridge.foreign_types():     # not the other cartridges' entities its relations end at
                types = self.cartridge.spec.entities
                entities = (e for e in entities if e[0].partition(":")[0] in types)
            cached = self._indexes[self.tenant] = (version, SearchIndex(
                entities, self.search_options(), previous=None if cached is None else cached[1]))
        return cached[1]

    def search_options(self) -> SearchOptions:
        """The cartridge's `search:` section and its types' descriptions, as the index takes them."""
        spec = self.cartridge.spec
        return SearchOptions(spec.search.semantic, tuple(tuple(g) for g in spec.search.synonyms),
                             tuple((t, e.description) for t, e in sorted(spec.entities.items())))


def _version(v: Version, by: Assertion | None) -> dict[str, Any]:
    """A label or relation version of `history`: its validity, provenance and what superseded it (the fields
    of a fact version there, without value, scope and expiry)."""
    a = v.assertion
    return {"valid_from": format_time(a.point), "valid_to": format_time(v.valid_to),
            "recorded_at": format_time(a.recorded_at), "source": a.source, "evidence": a.evidence, "by": a.by,
            "corrected_by": v.corrected_by, "superseded_at": format_time(None if by is None else by.recorded_at),
            "superseded_by": None if by is None else by.evidence}


def _by(agent: str | None) -> str | None:
    """The `by` of a caller's events: its agent binding, as `agent:<id>` unless it names its kind."""
    return None if not agent else agent if ":" in agent else f"agent:{agent}"


def _own(value: Any) -> Any:
    """A JSON value the caller may change: objects and arrays copied (an embedded graph, the search index and
    the cartridge keep theirs in memory and would hand out their own)."""
    return copy.deepcopy(value) if isinstance(value, (dict, list)) else value


def _owned(values: dict[str, Any]) -> dict[str, Any]:
    """A mapping of JSON values (labels, rule parameters) the caller may change, copied only when it holds
    an object or an array (the mapping itself is a new one per call)."""
    if any(isinstance(v, (dict, list)) for v in values.values()):
        return {k: _own(v) for k, v in values.items()}
    return values


def _owned_values(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fact results (new dicts per call) whose `value` the caller may change."""
    for row in rows:
        if isinstance(row["value"], (dict, list)):
            row["value"] = copy.deepcopy(row["value"])
    return rows
