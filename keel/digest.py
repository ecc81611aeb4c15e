"""`keel digest`: a hash of one tenant's graph over a canonical serialization, equal across stores; with
`--search-model`, beside it (not part of the hash), the identity of the model behind search's semantic signal."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from typing import Any

from .cartridge import Cartridge
from .store.base import Store
from .times import format_time


def canonical_lines(store: Store, tenant: str) -> Iterator[str]:
    """One canonical JSON line per applied event id, then per timeline (key + every assertion)."""
    yield _dump({"tenant": tenant})
    for event_id in store.event_ids(tenant):
        yield _dump({"event": event_id})
    for key, assertions in store.dump(tenant):
        yield _dump({"key": list(key), "assertions": [_assertion(a) for a in assertions]})


def _assertion(a: Any) -> list[Any]:
    return [format_time(a.point), a.value, a.closed, a.source, a.evidence, format_time(a.recorded_at), a.by,
            format_time(a.expires_at)]


def _dump(doc: Any) -> str:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def digest(store: Store, tenant: str) -> str:
    """`sha256:<hex>` of the canonical serialization of a tenant's graph."""
    h = hashlib.sha256()
    for line in canonical_lines(store, tenant):
        h.update(line.encode())
        h.update(b"\n")
    return "sha256:" + h.hexdigest()


def set_digest(stores: dict[str, Store], tenant: str) -> str:
    """A tenant's digest over several cartridges: a line `<cartridge> sha256:…` per cartridge (by name), then
    `all sha256:…`, the hash of those lines (equal graphs of every cartridge, equal last line)."""
    lines = [f"{name} {digest(stores[name], tenant)}" for name in sorted(stores)]
    whole = hashlib.sha256("".join(line + "\n" for line in lines).encode()).hexdigest()
    return "\n".join([*lines, f"all sha256:{whole}"])


def search_model(cartridges: list[Cartridge]) -> str:
    """`search-model <identity>` (keel.semantic), or `search-model none` when no cartridge ranks search by
    meaning: `keel digest --search-model` prints it after the digest, so that equal outputs mean equal graphs
    under an equal model, hence equal search rankings (the graph's digest does not depend on the model)."""
    if not any(c.spec.search.semantic for c in cartridges):
        return "search-model none"
    from .semantic import identity
    return f"search-model {identity()}"
