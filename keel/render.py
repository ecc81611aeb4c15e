"""Human-readable renderings of tool results for the CLI (the --json form is the result itself)."""
from __future__ import annotations

import json
from typing import Any

from .times import format_day, parse_time


def day(text: str | None) -> str:
    return format_day(None if text is None else parse_time(text))


def value(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)


def fact_line(f: dict[str, Any]) -> str:
    """A fact, note or label version (a label's name is under `label`) with its provenance."""
    name = f["predicate"] if "predicate" in f else f["label"]
    return f"{name}={value(f['value'])} valid {day(f['valid_from'])} -> {day(f['valid_to'])}  ({provenance(f)})"


def provenance(f: dict[str, Any]) -> str:
    """Where a version comes from: when recorded, its evidence and source, scope, who, expiry, corrections."""
    extras = [f"recorded {day(f['recorded_at'])}", f"evidence {f['evidence']}"]
    if f["source"]:
        extras.append(f"source {f['source']}")
    if f.get("scope"):
        extras.append(f"scope {f['scope']}")
    if f.get("attached_to"):
        extras.append(f"on {f['attached_to']}")
    if f["by"]:
        extras.append(f"by {f['by']}")
    if f.get("expires_at"):
        extras.append(f"expires {day(f['expires_at'])}")
    if f["corrected_by"]:
        extras.append(f"corrected by {f['corrected_by']}")
    if f.get("superseded_at"):
        extras.append(f"superseded {day(f['superseded_at'])} by {f['superseded_by']}")
    return ", ".join(extras)


def relation_line(r: dict[str, Any]) -> str:
    return f"{r['subject']} -{r['relation']}-> {r['object']}  valid {day(r['valid_from'])} -> {day(r['valid_to'])}"


def context(c: dict[str, Any]) -> str:
    when = []
    if c["at"]:
        when.append(f"at {day(c['at'])}")
    if c["known_at"]:
        when.append(f"as known at {day(c['known_at'])}")
    lines = [f"{c['entity']} ({c['type']})" + (f"  ref {c['ref']}" if c["ref"] else "")
             + (f"  [{', '.join(when)}]" if when else "")]
    if c["labels"]:
        lines.append("  " + " · ".join(f"{k}: {value(v)}" for k, v in c["labels"].items()))
    lines.append("facts:" if c["facts"] else "facts: none")
    lines += [f"  {fact_line(f)}" for f in c["facts"]]
    lines.append("relations:" if c["relations"] else "relations: none")
    lines += [f"  {relation_line(r)}" for r in c["relations"]]
    if c["rules"]:
        lines.append("rules:")
        for name, rule in c["rules"].items():
            params = ", ".join(f"{k}={value(v)}" for k, v in rule.items() if k not in VERDICT_KEYS)
            lines.append(f"  {name}: {rule['definition']}" + (f" ({params})" if params else ""))
            if "when" in rule:
                lines.append(f"    when {rule['when']}  ->  {verdict(rule)}")
    return "\n".join([*lines, fresh(c)])


def fresh(result: dict[str, Any]) -> str:
    """How current the answer is: what it is based on (known_through), the latest recorded_at applied when
    that is later (a known_at question), and the workers' lag when known."""
    applied = result.get("applied_through")
    later = f"; applied through {applied}" if applied and applied != result.get("known_through") else ""
    lag = f", workers {result['lag']} record(s) behind at their last commit" if result.get("lag") else ""
    return f"(known through {result.get('known_through') or 'nothing yet'}{later}{lag})"


VERDICT_KEYS = ("definition", "when", "holds", "because", "missing", "reason")


def verdict(rule: dict[str, Any]) -> str:
    """`holds` of a rule with its evidence, or why there is none."""
    because = f" (because {', '.join(rule['because'])})" if rule.get("because") else ""
    if rule.get("holds") is not None:
        return f"{'holds' if rule['holds'] else 'does not hold'}{because}"
    if rule.get("missing"):
        return f"unknown: missing {', '.join(rule['missing'])}"
    return f"unknown: {rule.get('reason')}"


def history(h: dict[str, Any]) -> str:
    """Every timeline of the entity by kind (labels, facts, notes, relations), each version on its line."""
    facts = [f for f in h["versions"] if not f["scope"]]
    notes = [f for f in h["versions"] if f["scope"]]
    labels, relations = h.get("labels", []), h.get("relations", [])
    lines = [f"{h['entity']}:"]
    for kind, versions in (("labels", labels), ("facts", facts), ("notes", notes)):
        if versions:
            lines += [f"{kind}:", *(f"  {fact_line(v)}" for v in versions)]
    if relations:
        lines += ["relations:", *(f"  {relation_line(r)}  ({provenance(r)})" for r in relations)]
    if len(lines) == 1:
        lines[0] += " no versions"
    return "\n".join([*lines, fresh(h)])


def changes(c: dict[str, Any]) -> str:
    """`history` without an entity: one line per change, oldest first, then where the next page starts."""
    lines = []
    for x in c["changes"]:
        name = x["name"] or ""
        if x["object"]:
            name += f" {x['object']}"
        if x["scope"]:
            name += f" ({x['scope']})"
        old, new = ("-" if v is None else value(v) for v in (x["old"], x["new"]))
        reason = f", reason {x['reason']}" if x.get("reason") else ""
        lines.append(f"{x['recorded_at']} {x['entity']} {x['what']} {name} {x['change']}: {old} -> {new}  valid "
                     f"{day(x['valid_from'])} -> {day(x['valid_to'])}  (evidence {x['evidence']}, by {x['by']}{reason})")
    if not lines:
        lines.append("no changes")
    lines.append(f"{'more' if c['more'] else 'next time'}: --cursor {c['cursor']}")
    return "\n".join([*lines, fresh(c)])


def search(s: dict[str, Any]) -> str:
    lines = [f"{i}. {r['entity']} ({r['type']}) score {r['score']:.3f}  "
             + " ".join(f"{k}={value(v)}" for k, v in r["labels"].items())
             for i, r in enumerate(s["results"], 1)]
    return "\n".join(lines + [s["message"]]) if lines else s["message"]


def related(r: dict[str, Any]) -> str:
    if not r["relations"]:
        return f"{r['entity']}: no relations"
    return "\n".join([*(relation_line(x) for x in r["relations"]), fresh(r)])


def note(n: dict[str, Any]) -> str:
    if not n.get("applied", True):
        return f"logged as {n['event_id']}, not applied yet: {n['message']}"
    withdrawn = n["fact"].get("withdrawn")
    if withdrawn:
        why = f": {withdrawn['reason']}" if withdrawn.get("reason") else ""
        return f"withdrawn by {withdrawn['by']}{why}\n  {fact_line(n['fact'])}"
    return f"noted {fact_line(n['fact'])}"
