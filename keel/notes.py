"""Agent memory policy (docs/semantics.md, "Notes"): scopes, evidence, TTLs, visibility, global notes."""
from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable

from . import reading
from .cartridge import Cartridge
from .envelope import ENTITY
from .errors import NoteRefused, UsageError
from .store.base import GLOBAL_TENANT, EntityView, Store, ViewRequest, Write
from .store.provenance import evidence_standing
from .store.writes import Key, new_write, scope_key
from .timeline import Assertion, Version, new_assertion
from .times import Micros, format_time

SCOPES = ("global", "tenant", "task", "agent")
# A note's name (its predicate), as the keel.annotated payload check in keel.envelope accepts it.
NOTE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]{0,127}")
NOTE_NAME_RULE = ("1 to 128 characters: ASCII letters, digits, _ . and -, starting with a letter or _ "
                  "(e.g. next_step, risk.level)")
GLOBAL_SOURCE = "global"
WITHDRAWN = "keel.withdrawn"    # the value of a withdrawal's end: {WITHDRAWN: <event id>, "reason"?: <text>}
ANONYMOUS = {"source": GLOBAL_SOURCE, "evidence": None, "by": None}


class NoteNameError(UsageError):
    """A note name (annotate's `predicate`) that is not one; the message says what a name may contain."""


class NotePolicy:
    """Decides whether a note may be written and who may see notes."""

    def __init__(self, cartridge: Cartridge, store: Store, *, allow_global: bool = False) -> None:
        self.cartridge = cartridge
        self.store = store
        self.allow_global = allow_global

    def ttl(self, scope: str) -> Micros | None:
        return self.cartridge.spec.memory.ttl_micros(scope)

    def check(self, tenant: str, entity: str, scope: str, evidence: str | None, *,
              task: str | None, agent: str | None) -> None:
        """Raise NoteRefused unless the note is allowed; runs in the tool and again when applied."""
        def refuse(reason: str) -> NoteRefused:
            return NoteRefused(reason, tenant=tenant, entity=entity, scope=scope)

        if scope not in SCOPES:
            raise refuse(f"unknown scope {scope!r}; use one of {', '.join(SCOPES)}")
        if scope == "global":
            if not self.allow_global:
                raise refuse("global notes are disabled by the operator")
            kind, _, name = entity.partition(":")
            spec = self.cartridge.spec
            if not ((kind == "type" and name in spec.entities) or (kind == "rule" and name in spec.rules)):
                raise refuse("global notes attach to type:<entity type> or rule:<rule name> of the cartridge")
        elif scope == "task" and not task:
            raise refuse("a task-scope note needs a task binding (--task, or the token's task); "
                         "this caller is bound to no task")
        elif scope == "agent" and not agent:
            raise refuse("an agent-scope note needs an agent binding (--agent, or the token's agent)")
        elif not reading.exists(self.store, tenant, entity):
            raise refuse("unknown entity; notes attach to entities of the graph (try search)")
        if scope in self.cartridge.spec.memory.requires_evidence:
            self._check_evidence(tenant, entity, evidence, refuse)

    def _check_evidence(self, tenant: str, entity: str, evidence: str | None,
                        refuse: Callable[[str], NoteRefused]) -> None:
        """Evidence is a domain event of this tenant, not retracted, whose writes touched the entity (for
        type:<t> / rule:<r>, an entity of that type / of a type the rule applies to)."""
        kind, _, name = entity.partition(":")
        if kind == "type":
            of_type: str | None = name
        elif kind == "rule" and name in self.cartridge.spec.rules:
            of_type = self.cartridge.spec.rules[name].applies_to
        else:
            of_type = None
        what = entity if of_type is None else f"an entity of type {of_type}"
        wanted = (f"the id of a domain event of tenant {tenant!r} whose writes touched {what} "
                  f"(an `evidence` of its facts in context or history; a note, a retraction or a retracted event is no evidence)")
        if not evidence:
            raise refuse(f"this scope requires evidence: pass {wanted}")
        if not self.store.has_event(tenant, evidence):
            raise refuse(f"evidence {evidence!r} is not an event of this tenant; pass {wanted}")
        standing = (evidence_standing(self.store, tenant, evidence, entity=entity) if of_type is None
                    else evidence_standing(self.store, tenant, evidence, type=of_type))
        if standing == "retraction":
            raise refuse(f"evidence {evidence!r} is a retraction, not a domain event; pass {wanted}")
        if standing == "retracted":
            raise refuse(f"evidence {evidence!r} was retracted; pass {wanted}")
        if standing is None:
            raise refuse(f"evidence {evidence!r} wrote nothing about {what}; pass {wanted}")

    def withdrawable(self, tenant: str, entity: str, predicate: str, scope: str, *, task: str | None,
                     agent: str | None, by: str | None, at: Micros) -> tuple[Key, Version]:
        """The note a withdrawal by `by` at `at` closes: the version in force at `at` of the caller's timeline of
        (entity, predicate, scope), written by `by`. Raises NoteRefused saying why there is none to close. The
        scope, binding and evidence checks are `check`'s, made before (in the tool and when applied)."""
        def refuse(reason: str) -> NoteRefused:
            return NoteRefused(reason, tenant=tenant, entity=entity, scope=scope)

        if scope == "global":
            raise refuse("global notes cannot be withdrawn: they are read in every tenant without their writer, "
                         "so no agent can show it wrote one")
        if not by:
            raise refuse("withdrawing a note needs an agent binding (--agent, or the token's agent): only the "
                         "agent that wrote a note may withdraw it")
        key = note_key(entity, predicate, scope, task=task, agent=agent)
        [version] = self.store.as_of_many(tenant, [key], at, None)
        if version is None:
            raise refuse(f"no {scope} note {predicate!r} is in force on this entity at {format_time(at)} "
                         f"(never written, expired or withdrawn: see history)")
        if version.assertion.by != by:
            raise refuse(f"the {scope} note {predicate!r} in force was written by another agent; only its writer "
                         f"may withdraw it (write a note of your own instead)")
        return key, version

    @staticmethod
    def visible_scopes(*, task: str | None, agent: str | None) -> list[str]:
        """Fact scope keys a caller may read: domain facts, tenant notes, its task's and its own."""
        keys = ["", "tenant"]
        if task:
            keys.append(f"task:{task}")
        if agent:
            keys.append(f"agent:{agent}")
        return keys

    def write_global(self, writes: list[Write]) -> None:
        self.store.apply_writes(GLOBAL_TENANT, writes)

    @staticmethod
    def global_note_views(entity_type: str, rules: list[str]) -> list[ViewRequest]:
        """The views of the global graph holding the notes on an entity type and on the rules that apply to
        it (subjects that are no valid entity name cannot hold notes and are left out)."""
        subjects = [f"type:{entity_type}", *(f"rule:{r}" for r in rules)]
        return [ViewRequest(GLOBAL_TENANT, s, ("global",), "f") for s in subjects if ENTITY.fullmatch(s)]

    @staticmethod
    def global_notes(views: list[EntityView | None]) -> list[dict]:
        """The notes (fact objects) of the views `global_note_views` asked for, attributed as global: they are
        read in every tenant, so they carry nothing of the tenant that wrote them (event id, agent, source).
        Each says what it is attached to (`attached_to`: `type:<entity type>` or `rule:<rule name>`), since it
        is shown among the facts of an entity it was not written on."""
        return [{**anonymous(fact), "attached_to": view.info.entity}
                for view in views if view is not None for fact in view.facts]


def check_note_name(name: object) -> str:
    """A note's name, or a NoteNameError saying what is wrong with it and what a name may contain."""
    if name is None or name == "":
        raise NoteNameError(f"predicate: required, the note's name: {NOTE_NAME_RULE}")
    if not isinstance(name, str):
        raise NoteNameError(f"predicate: expected text, got {type(name).__name__}; a note name has {NOTE_NAME_RULE}")
    if NOTE_NAME.fullmatch(name):
        return name
    shown = name if len(name) <= 60 else name[:60] + "…"
    if len(name) > 128:
        what = f"is {len(name)} characters long"
    elif not (name[0].isascii() and (name[0].isalpha() or name[0] == "_")):
        what = f"starts with {name[0]!r}"
    else:
        bad = sorted({c for c in name if not NOTE_NAME.fullmatch("a" + c)})
        what = f"holds {', '.join(repr(c) for c in bad)}"
    raise NoteNameError(f"predicate: {shown!r} is not a note name: it {what}; a note name has {NOTE_NAME_RULE}")


def note_key(entity: str, predicate: str, scope: str, *, task: str | None, agent: str | None) -> Key:
    """The timeline of a note: (entity, predicate) in its scope, a task's or an agent's own for those scopes."""
    owner = task if scope == "task" else agent if scope == "agent" else None
    return ("f", entity, predicate, scope_key(scope, owner))


def withdrawal_write(key: Key, at: Micros, *, event_id: str, reason: str | None, source: str | None,
                     evidence: str | None, recorded_at: Micros, by: str | None) -> Write:
    """The end a withdrawal writes on a note's timeline at `at`: valued {WITHDRAWN: event id, reason?}, so
    `history` tells who (`by`), when (`recorded_at`) and why; an end like any other for every other read."""
    value: dict[str, str] = {WITHDRAWN: event_id}
    if reason:
        value["reason"] = reason
    return new_write(key, new_assertion(at, value, True, source, evidence or event_id, recorded_at, by))


def withdrawal_of(a: Assertion) -> dict | None:
    """What `history` shows of a note version's withdrawal, from the end that closed it (None: no withdrawal)."""
    if not (a.closed and type(a.value) is dict and WITHDRAWN in a.value):
        return None
    return {"at": format_time(a.recorded_at), "by": a.by, "reason": a.value.get("reason"),
            "event_id": a.value[WITHDRAWN], "evidence": None if a.evidence == a.value[WITHDRAWN] else a.evidence}


def withdrawal_id(tenant: str, by: str, key: Key, target: Version) -> str:
    """The event id of a withdrawal: an idempotency key of who withdraws which version (its point, recorded_at
    and evidence). A version is withdrawn once, so a retry of the call sends the same id and nothing else does."""
    a = target.assertion
    call = [tenant, by, list(key), a.point, a.recorded_at, a.evidence]
    text = json.dumps(call, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    return "withdrawal-" + hashlib.sha256(text.encode()).hexdigest()[:32]


def anonymous(fact: dict) -> dict:
    """A global note's fact object without the writing tenant's identifiers, attributed as global."""
    return {**fact, **ANONYMOUS, "corrected_by": fact["corrected_by"] and GLOBAL_SOURCE}


NOTE_WINDOW_S = 600      # a retry of the same note by the same caller within this window is the same note


def note_id(tenant: str, agent: str | None, task: str | None, entity: str, predicate: str, value: object,
            scope: str, evidence: str | None, now: Micros, window_s: int = NOTE_WINDOW_S, *,
            after: str | None = None) -> str:
    """The event id of a note: an idempotency key derived from the call (who: tenant, agent, task; what:
    entity, predicate, value, scope, evidence) and the clock-aligned window of `window_s` seconds it falls
    in. An agent that retries a call (e.g. after a timeout) within the window sends the same id, which the
    log applies once; the same note written again in a later window is a new note. (A retry that crosses a
    window boundary makes a second note.) `after`: the latest withdrawal on the note's timeline, so the same
    note written again after it was withdrawn, within the window, is a new note (left out when None, so the ids
    of notes never withdrawn are as before)."""
    call = [tenant, agent, task, entity, predicate, value, scope, evidence, now // (window_s * 1_000_000)]
    if after is not None:
        call.append(after)
    text = json.dumps(call, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    return "note-" + hashlib.sha256(text.encode()).hexdigest()[:32]
