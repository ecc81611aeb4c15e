"""Agent memory policy (DESIGN §5): scopes, evidence, TTLs, visibility, global notes."""
from __future__ import annotations

import hashlib
import json

from .cartridge import Cartridge
from .envelope import ENTITY
from .errors import NoteRefused
from .store.base import GLOBAL_TENANT, EntityView, Store, ViewRequest, Write
from .times import Micros

SCOPES = ("global", "tenant", "task", "agent")


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
        if scope in self.cartridge.spec.memory.requires_evidence:
            if not evidence:
                raise refuse(f"scope {scope} requires evidence: pass the id of the event that supports it "
                             f"(see `evidence` in context or history)")
            if not self.store.has_event(tenant, evidence):
                raise refuse(f"evidence {evidence!r} is not an event of this tenant")
        if scope == "global":
            if not self.allow_global:
                raise refuse("global notes are disabled by the operator")
            kind, _, name = entity.partition(":")
            spec = self.cartridge.spec
            if not ((kind == "type" and name in spec.entities) or (kind == "rule" and name in spec.rules)):
                raise refuse("global notes attach to type:<entity type> or rule:<rule name> of the cartridge")
            return
        if scope == "task" and not task:
            raise refuse("a task-scope note needs a task id (--task, or the server's task binding)")
        if scope == "agent" and not agent:
            raise refuse("an agent-scope note needs an agent id (--agent, or the server's agent binding)")
        if not self.store.exists(tenant, entity):
            raise refuse("unknown entity; notes attach to entities of the graph (try search)")

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
        """The notes (fact objects) of the views `global_note_views` asked for."""
        return [fact for view in views if view is not None for fact in view.facts]


NOTE_WINDOW_S = 600      # a retry of the same note by the same caller within this window is the same note


def note_id(tenant: str, agent: str | None, task: str | None, entity: str, predicate: str, value: object,
            scope: str, evidence: str | None, now: Micros, window_s: int = NOTE_WINDOW_S) -> str:
    """The event id of a note: an idempotency key derived from the call (who: tenant, agent, task; what:
    entity, predicate, value, scope, evidence) and the clock-aligned window of `window_s` seconds it falls
    in. An agent that retries a call (e.g. after a timeout) within the window sends the same id, which the
    log applies once; the same note written again in a later window is a new note. (A retry that crosses a
    window boundary makes a second note.)"""
    call = [tenant, agent, task, entity, predicate, value, scope, evidence, now // (window_s * 1_000_000)]
    text = json.dumps(call, ensure_ascii=False, separators=(",", ":"), sort_keys=True, default=str)
    return "note-" + hashlib.sha256(text.encode()).hexdigest()[:32]
