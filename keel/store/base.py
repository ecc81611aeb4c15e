"""The store contract: `Store`, the composition of its three roles (keel/store/roles.py), and the names that go
with it, imported from here by backends and callers alike.

    StoreReads     the primitive reads (keel/reading.py shapes them into tool results)
    BatchWrites    writes, commit steps with offsets, applied watermarks
    StoreAdmin     the namespace as a whole

A backend implements the roles' primitives over *timelines* (see keel.timeline): apply a list of writes
atomically, list an entity's timeline keys, and answer as-of / all-versions questions for keys. Everything the
graph promises (provenance, corrections, both time axes, result shapes: docs/semantics.md) is built on those
primitives, so every backend behaves the same and one contract suite per role (tests/support/reads_contract.py,
batch_contract.py) checks them all. A caller that needs one role is typed with that role.
"""
from __future__ import annotations

from typing import Any

from .roles import (  # the roles and their shapes, imported from here with the Store they compose
    BatchStep,
    BatchWrites,
    ChangeEntry,
    ChangePage,
    EventWrites,
    PartitionOffsets,
    Position,
    StoreAdmin,
    StoreReads,
    TenantStart,
    Window,
    went_back,
)
from .shapes import (  # the result shapes, imported from here by the backends
    EntityInfo,
    EntityView,
    Freshness,
    ViewRequest,
    entities_of,
    entity_view,
    fact_order,
    fact_result,
    of_relation,
    relation_result,
    scope_of,
    select_keys,
)
from .writes import (  # the write vocabulary, re-exported with the contract that applies it
    REF_LABEL,
    EventId,
    Key,
    Write,
    check_entity,
    checked_label_writes,
    event_key,
    fact_write,
    label_writes,
    new_write,
    relation_write,
    scope_key,
)

GLOBAL_TENANT = "_global"   # where cross-tenant (global) notes live; not a valid tenant name


class Store(StoreReads, BatchWrites, StoreAdmin):
    """A per-tenant bitemporal graph: every role. Subclasses implement the primitives the roles mark abstract."""

    def has_tenant(self, tenant: str) -> bool:
        """Whether the tenant has any write or applied event (is in `tenants`)."""
        return tenant in self.tenants()

    # ---- writes as a handler makes them (docs/cartridges.md), for tests, benches and scripts ----------

    def upsert_entity(self, tenant: str, type: str, id: str, *, ref: str | None = None,
                      valid_from: object, source: str | None = None, evidence: str | None = None,
                      recorded_at: object | None = None, by: str | None = None, **labels: Any) -> None:
        self.apply_writes(tenant, label_writes(f"{type}:{id}", ref, labels, valid_from=valid_from,
                                               source=source, evidence=evidence, recorded_at=recorded_at, by=by))

    def link(self, tenant: str, subject: str, relation: str, object: str, valid_from: object, *,
             source: str | None = None, evidence: str | None = None, recorded_at: object | None = None,
             by: str | None = None) -> None:
        self.apply_writes(tenant, [relation_write(subject, relation, object, valid_from, False, source=source,
                                                  evidence=evidence, recorded_at=recorded_at, by=by)])

    def unlink(self, tenant: str, subject: str, relation: str, object: str, valid_to: object, *,
               source: str | None = None, evidence: str | None = None, recorded_at: object | None = None,
               by: str | None = None) -> None:
        self.apply_writes(tenant, [relation_write(subject, relation, object, valid_to, True, source=source,
                                                  evidence=evidence, recorded_at=recorded_at, by=by)])

    def open_fact(self, tenant: str, subject: str, predicate: str, value: Any, *, valid_from: object,
                  source: str | None = None, evidence: str | None = None, recorded_at: object | None = None,
                  by: str | None = None, scope: str | None = None, owner: str | None = None,
                  expires_at: object | None = None) -> None:
        self.apply_writes(tenant, [fact_write(subject, predicate, value, valid_from, False, source=source,
                                              evidence=evidence, recorded_at=recorded_at, by=by, scope=scope,
                                              owner=owner, expires_at=expires_at)])

    def close_fact(self, tenant: str, subject: str, predicate: str, *, valid_to: object,
                   source: str | None = None, evidence: str | None = None, recorded_at: object | None = None,
                   by: str | None = None, scope: str | None = None, owner: str | None = None) -> None:
        self.apply_writes(tenant, [fact_write(subject, predicate, None, valid_to, True, source=source,
                                              evidence=evidence, recorded_at=recorded_at, by=by, scope=scope,
                                              owner=owner)])


__all__ = ["GLOBAL_TENANT", "REF_LABEL", "BatchStep", "BatchWrites", "ChangeEntry", "ChangePage", "EntityInfo",
           "EntityView", "EventId", "EventWrites", "Freshness", "Key", "PartitionOffsets", "Position", "Store",
           "StoreAdmin", "StoreReads", "TenantStart", "ViewRequest", "Window", "Write", "check_entity",
           "checked_label_writes", "entities_of", "entity_view", "event_key", "fact_order", "fact_result",
           "label_writes", "new_write", "of_relation", "relation_result", "relation_write", "scope_key", "scope_of",
           "select_keys", "went_back"]
