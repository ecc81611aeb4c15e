"""Provenance reads: what a store's assertions say of an event id (notes' evidence check).

Written once over the store contract's primitives (`index`, `entity_indexes`, `assertions_many`), so every
backend answers alike."""
from __future__ import annotations

from collections.abc import Iterable

from ..timeline import VOID, Assertion, is_retraction_void, is_void
from ..times import Micros
from .base import Key, Store


def evidence_standing(store: Store, tenant: str, event_id: str, *, entity: str | None = None,
                      type: str | None = None) -> str | None:
    """What the domain timelines of `entity` (or of every entity of `type`) say of `event_id`, read from
    the provenance (evidence) their assertions carry and the voids corrections and retractions wrote:
    "retraction" (it is a keel.retracted: it wrote retraction voids), "retracted" (a keel.retracted
    withdrew its assertions there), "touched" (it wrote a label, a domain fact or a relation from or to
    such an entity), or None (it wrote nothing there)."""
    if entity is not None:
        index = store.index(tenant, entity)
        candidates: Iterable[tuple[str, Micros, list[Key]]] = [] if index is None else [(entity, *index)]
    else:
        candidates = store.entity_indexes(tenant, type)
    touched = False
    chunk: list[Key] = []
    for _, _, keys in candidates:
        chunk += (k for k in keys if k[0] in "elr" or (k[0] == "f" and not k[3]))
        if len(chunk) >= 500:
            found = _standing(store.assertions_many(tenant, chunk), event_id)
            if found in ("retraction", "retracted"):
                return found
            touched, chunk = touched or found == "touched", []
    found = _standing(store.assertions_many(tenant, chunk), event_id) if chunk else None
    return found if found is not None else "touched" if touched else None


def _standing(timelines: Iterable[list[Assertion]], event_id: str) -> str | None:
    """evidence_standing over some timelines' assertions."""
    touched = False
    for assertions in timelines:
        for a in assertions:
            if a.evidence == event_id:
                if is_retraction_void(a):
                    return "retraction"
                touched = touched or not is_void(a)
            elif is_retraction_void(a) and a.value[VOID] == event_id:
                return "retracted"
    return "touched" if touched else None
