"""Provenance reads: what a store's assertions say of an event id (notes' evidence check).

Written once over the store contract's primitives (`index`, `entity_indexes`, `assertions_many`), so every
backend answers alike."""
from __future__ import annotations

from collections.abc import Iterable

from ..timeline import VOID, Assertion, is_retraction_void, is_void
from ..times import Micros
from .roles import StoreReads
from .writes import Key


def evidence_standing(store: StoreReads, tenant: str, event_id: str, *, entity: str | None = None,
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
    best: str | None = None
    chunk: list[Key] = []
    for _, _, keys in candidates:
        chunk += (k for k in keys if k[0] in "elr" or (k[0] == "f" and not k[3]))
        if len(chunk) >= 500:
            best = _stronger(best, _standing(store.assertions_many(tenant, chunk), event_id))
            if best == "retraction":
                return best
            chunk = []
    return _stronger(best, _standing(store.assertions_many(tenant, chunk), event_id) if chunk else None)


_RANK = {None: 0, "touched": 1, "retracted": 2, "retraction": 3}


def _stronger(a: str | None, b: str | None) -> str | None:
    """The answer that wins whatever order the timelines are read in: retraction, retracted, touched, None."""
    return a if _RANK[a] >= _RANK[b] else b


def _standing(timelines: Iterable[list[Assertion]], event_id: str) -> str | None:
    """evidence_standing over some timelines' assertions (the strongest answer among them)."""
    best: str | None = None
    for assertions in timelines:
        for a in assertions:
            if a.evidence == event_id:
                if is_retraction_void(a):
                    return "retraction"
                if not is_void(a):
                    best = _stronger(best, "touched")
            elif is_retraction_void(a) and a.value[VOID] == event_id:
                best = "retracted"
    return best
