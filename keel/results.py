"""The result objects of the five tools, as types (TypedDicts): what `keel.Tools` returns and what MCP sends.

At run time every result is a plain dict (JSON-ready: str, int, float, bool, None, lists and dicts), the
same object the MCP server encodes; these types only describe it for readers and type checkers. Times are
RFC 3339 strings in UTC (`2026-09-15T00:00:00Z`). Fields marked NotRequired appear only in some results
(docs/python.md says when). tests/test_python_api.py checks real results against these declarations. (No `from __future__ import
annotations` here: Python 3.11 reads NotRequired only from evaluated annotations.)
"""
from typing import Any, Literal, NotRequired, TypedDict

Scope = Literal["tenant", "task", "agent", "global"]


class Known(TypedDict):
    """What every result ends with: what the answer is based on (docs/contracts.md, "known_through")."""
    known_through: str | None           # recorded_at of the latest event applied for the tenant (or known_at)
    applied_through: NotRequired[str | None]    # with known_at: the latest recorded_at applied
    lag: NotRequired[int]               # Redis graph: records of the tenant's partition not applied yet (log end now)
    lag_measured_at: NotRequired[str]   # when the log end was read, given when Kafka has not answered since


class Fact(TypedDict):
    """A fact or a note as of the question's times (`scope` None: a domain fact)."""
    predicate: str
    value: Any
    valid_from: str
    valid_to: str | None
    recorded_at: str
    source: str | None
    evidence: str | None
    scope: str | None
    by: str | None
    expires_at: str | None
    corrected_by: str | None
    attached_to: NotRequired[str]       # a global note on the entity's type or rule: type:<t> or rule:<r>


class Withdrawal(TypedDict):
    """How a note version was withdrawn (annotate with `withdraw: true`): when it was recorded, by whom, why,
    the withdrawal's event id and the evidence it cited (None when none)."""
    at: str
    by: str | None
    reason: str | None
    event_id: str
    evidence: str | None


class FactVersion(Fact):
    """A version of a fact or note in `history`, with what superseded it (None while it is believed)."""
    superseded_at: str | None
    superseded_by: str | None
    withdrawn: NotRequired[Withdrawal]  # a note closed by its writer's withdrawal


class Relation(TypedDict):
    """A relation valid at the question's `at` (its validity coalesced over adjacent versions)."""
    subject: str
    relation: str
    object: str
    valid_from: str
    valid_to: str | None


class _Provenance(TypedDict):
    valid_from: str
    valid_to: str | None
    recorded_at: str
    source: str | None
    evidence: str | None
    by: str | None
    corrected_by: str | None
    superseded_at: str | None
    superseded_by: str | None


class LabelVersion(_Provenance):
    """A version of a label in `history` (`ref` included)."""
    label: str
    value: Any


class RelationVersion(_Provenance):
    """A version of a relation in `history`."""
    subject: str
    relation: str
    object: str


class SearchHit(TypedDict):
    entity: str
    type: str
    labels: dict[str, Any]
    score: float
    found_by: str           # "lexical", "semantic" or "both": which signal of search found it


class ContextResult(Known):
    entity: str
    type: str
    ref: str | None
    labels: dict[str, Any]
    at: str | None
    known_at: str | None
    facts: list[Fact]
    relations: list[Relation]
    # by rule name: the rule's definition and parameters (a cartridge's own keys), and for a rule with `when:`
    # Keel's verdict: holds (bool or None), because (evidence ids), missing or reason when holds is None
    rules: dict[str, dict[str, Any]]


class HistoryResult(Known):
    entity: str
    versions: list[FactVersion]
    labels: list[LabelVersion]
    relations: list[RelationVersion]


class Change(TypedDict):
    """One change of `history` without an entity (docs/semantics.md, "What changed since")."""
    entity: str
    what: str                           # label, fact, note, relation, or entity (its existence)
    name: str | None                    # the label, predicate or relation (None: an entity's existence)
    object: str | None                  # a relation's other end
    scope: str | None                   # a note's scope
    change: str                         # version, corrected, closed, withdrawn, retracted or erased
    old: Any                            # the value at valid_from just before the change (None: none)
    new: Any                            # and just after it
    valid_from: str | None
    valid_to: str | None
    recorded_at: str
    source: str | None
    evidence: str | None
    by: str | None
    reason: NotRequired[str | None]     # a withdrawn note: why


class ChangesResult(Known):
    """`history` without an entity: the tenant's changes recorded after `since`, oldest first; `cursor`
    continues exactly after them (now, or later to get what came since), `more` says whether the log held more
    when read; `known_through` is complete: every change recorded by then was in this answer or before."""
    since: str | None
    type: str | None
    changes: list[Change]
    cursor: str
    more: bool


class SearchResult(Known):
    query: str
    results: list[SearchHit]
    message: str


class AnnotateResult(Known):
    """`applied` True: `fact` is the note as the graph shows it (a version, as `history` lists it). False
    (Redis graph, not applied within the apply timeout): the note is in the log and will be applied; `message`
    says so."""
    applied: bool
    event_id: str
    fact: NotRequired[FactVersion]
    message: NotRequired[str]


class RelatedResult(Known):
    entity: str
    relations: list[Relation]
