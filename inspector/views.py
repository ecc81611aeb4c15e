"""What the pages show, made from the tools' result objects only (context, history, search): the entity view's
parts, its history rows and its bitemporal charts. Nothing here reads the store: the page shows what an
agent gets from the same calls.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlencode

from keel.results import ContextResult, HistoryResult
from keel.times import Micros, format_day, parse_time

from .chart import Chart, Scale, Span, chart, short_time

VERDICT_KEYS = ("definition", "when", "holds", "because", "missing", "reason")
PROVENANCE = ("valid_from", "valid_to", "recorded_at", "superseded_at", "superseded_by", "evidence", "source",
              "by", "corrected_by", "scope", "expires_at", "attached_to")


def text(value: Any) -> str:
    """A JSON value as the page shows it: a string as itself, anything else as compact JSON (exact numbers)."""
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def day(value: str | None) -> str:
    """An RFC 3339 time of a result as the page shows it: the date alone at midnight UTC, else
    `2026-10-04 09:00Z` (seconds and fractions when there are some), '' when absent."""
    return "" if value is None else short_time(parse_time(value))


def micros(value: str | None) -> Micros | None:
    return None if value is None else parse_time(value)


@dataclass(frozen=True)
class Times:
    """The view's `at` and `known_at` as the person gave them (query parameters; '' is now)."""
    at: str = ""
    known_at: str = ""

    def query(self, **more: str) -> str:
        """`?at=…&known_at=…&more…` with the empty ones left out ('' when nothing is set)."""
        pairs = {"at": self.at, "known_at": self.known_at, **more}
        kept = {k: v for k, v in pairs.items() if v}
        return "?" + urlencode(kept) if kept else ""


@dataclass(frozen=True)
class Place:
    """Where a page is: the cartridge and tenant, for the links it makes."""
    cartridge: str
    tenant: str

    @property
    def home(self) -> str:
        return f"/c/{quote(self.cartridge, safe='')}/t/{quote(self.tenant, safe='')}"

    def entity(self, entity: str, times: Times, anchor: str = "") -> str:
        return f"{self.home}/e/{quote(entity, safe=':@')}{times.query()}{'#' + anchor if anchor else ''}"

    def search(self, query: str, times: Times) -> str:
        return f"{self.home}{times.query(q=query)}"


@dataclass
class Row:
    """One version of the history list (and its rectangle in the chart of its timeline)."""
    anchor: str
    kind: str                # fact, note, label, relation
    timeline: str
    value: str
    version: Mapping[str, Any]
    current: bool = False
    link: str = ""           # a relation's other end, as a link to its entity view
    other: str = ""

    @property
    def provenance(self) -> list[tuple[str, str]]:
        """The version's whole record, field by field, as its <title> and row show it ('' fields left out)."""
        return [(k, text(self.version[k])) for k in PROVENANCE if self.version.get(k) is not None]

    @property
    def title(self) -> str:
        lines = [f"{self.timeline} = {self.value}" if self.kind != "relation" else self.timeline]
        lines += [f"{k}: {v}" for k, v in self.provenance]
        return "\n".join(lines)


@dataclass
class EntityView:
    """The entity page: context at the view's times, the history as known at known_at, the charts."""
    context: ContextResult
    labels: list[tuple[str, str]]
    facts: list[Mapping[str, Any]]
    notes: list[Mapping[str, Any]]
    relations: list[dict[str, Any]]
    rules: list[dict[str, Any]]
    rows: list[Row]
    charts: list[tuple[str, Chart]]            # (section: facts, notes, labels, relations), chart
    steps: list[tuple[str, str, bool]]         # known_at choices: (text, link, is the view's)
    at_steps: list[tuple[str, str, bool]]      # at choices: valid_from times of the facts
    now_link: str                              # the view at now, as known now

    @property
    def more_charts(self) -> int:
        """How many label and relation timelines (shown folded)."""
        return sum(kind in ("label", "relation") for kind, _ in self.charts)


def entity_view(context: ContextResult, history: HistoryResult, everything: HistoryResult, place: Place,
                times: Times, now: Micros) -> EntityView:
    """Build the entity page from `context` (at, known_at), `history` (known_at) and `everything` (history as
    known now, for the known_at steps)."""
    entity = context["entity"]
    at = micros(context["at"])
    known_at = micros(context["known_at"])
    t = now if at is None else at
    labels = [("ref", text(context["ref"]))] if context["ref"] is not None else []
    labels += [(k, text(v)) for k, v in context["labels"].items()]
    facts = [f for f in context["facts"] if f["scope"] is None]
    notes = [f for f in context["facts"] if f["scope"] is not None]
    shown = {(f["predicate"], f["scope"], f["valid_from"], f["recorded_at"], f["evidence"]) for f in context["facts"]}
    relations = []
    for r in context["relations"]:
        other = r["object"] if r["subject"] == entity else r["subject"]
        relations.append({**r, "other": other, "link": place.entity(other, times),
                          "outgoing": r["subject"] == entity})
    rules = []
    for name, rule in context["rules"].items():
        params = [(k, text(v)) for k, v in rule.items() if k not in VERDICT_KEYS]
        rules.append({"name": name, **{k: rule.get(k) for k in VERDICT_KEYS}, "has_verdict": "holds" in rule,
                      "params": params})

    rows: list[Row] = []

    def add(kind: str, timeline: str, value: str, version: Mapping[str, Any], current: bool, **more: str) -> None:
        rows.append(Row(f"v{len(rows) + 1}", kind, timeline, value, version, current, **more))

    for v in history["versions"]:
        kind = "fact" if v["scope"] is None else "note"
        name = v["predicate"] if kind == "fact" else f"{v['predicate']} (note, {v['scope']})"
        add(kind, name, text(v["value"]), v,
            (v["predicate"], v["scope"], v["valid_from"], v["recorded_at"], v["evidence"]) in shown)
    for label in history["labels"]:
        add("label", f"{label['label']} (label)", text(label["value"]), label, _holds(label, t))
    for rel in history["relations"]:
        outgoing = rel["subject"] == entity
        other = rel["object"] if outgoing else rel["subject"]
        name = f"{rel['relation']} → {other}" if outgoing else f"{other} → {rel['relation']}"
        add("relation", name, other, rel, _holds(rel, t), link=place.entity(other, times), other=other)

    spans = {row.anchor: _span(row) for row in rows}
    charts: list[tuple[str, Chart]] = []
    if rows:
        scale = Scale.of(spans.values(), at, known_at)
        grouped: dict[tuple[str, str], list[Row]] = {}
        for row in rows:
            grouped.setdefault((row.kind, row.timeline), []).append(row)
        for (kind, timeline), members in grouped.items():
            height = 150 if kind in ("fact", "note") else 104
            charts.append((kind, chart(timeline, [spans[r.anchor] for r in members], scale, at=at,
                                       known_at=known_at, height=height)))

    recorded = sorted({micros(v["recorded_at"]) for v in _all_versions(everything)} - {None})
    steps = [(short_time(k), place.entity(entity, Times(times.at, format_day(k))), k == known_at)
             for k in recorded if k is not None]
    steps.append(("now", place.entity(entity, Times(times.at, "")), known_at is None))
    valid = sorted({micros(v["valid_from"]) for v in history["versions"] if v["scope"] is None} - {None})
    at_steps = [(short_time(a), place.entity(entity, Times(format_day(a), times.known_at)), a == at)
                for a in valid if a is not None]
    at_steps.append(("now", place.entity(entity, Times("", times.known_at)), at is None))
    return EntityView(context, labels, facts, notes, relations, rules, rows, charts, steps, at_steps,
                      place.entity(entity, Times()))


def _all_versions(result: HistoryResult) -> list[Mapping[str, Any]]:
    return [*result["versions"], *result["labels"], *result["relations"]]


def _holds(version: Mapping[str, Any], t: Micros) -> bool:
    """A label or relation version believed (as known at the history's known_at) and valid at `t`."""
    start, end = parse_time(version["valid_from"]), micros(version["valid_to"])
    return version["superseded_at"] is None and start <= t and (end is None or t < end)


def _span(row: Row) -> Span:
    v = row.version
    return Span(row.anchor, row.value, row.title, parse_time(v["valid_from"]), micros(v["valid_to"]),
                parse_time(v["recorded_at"]), micros(v["superseded_at"]), row.current, row.kind == "note")


def search_hits(result: Mapping[str, Any], place: Place, times: Times) -> list[dict[str, Any]]:
    """The search result's hits with a link to each entity's view and its labels as text."""
    return [{**hit, "link": place.entity(hit["entity"], times),
             "label_text": [(k, text(v)) for k, v in hit["labels"].items()]} for hit in result["results"]]


Formatter = Callable[[Any], str]
FILTERS: dict[str, Formatter] = {"text": text, "day": day}
