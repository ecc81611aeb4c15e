"""The version of the Redis key layout, checked by every process when it opens a namespace.

`keel:{<namespace>}:layout` holds the layout version the namespace was written with (same hash tag as the
namespace's tenant registry). A namespace without it is stamped with the current version: either it is
new, or it was written by a Keel from before the stamp, whose layout is version 1. A process built for
another version refuses to start, with a message saying what to run, instead of reading keys it does not
understand or writing a mix of two layouts. CHANGELOG.md lists each layout change and its upgrade step.
"""
from __future__ import annotations

from typing import Any

from ...errors import UsageError
from .keys import layout_key

LAYOUT_VERSION = 1


class LayoutIncompatible(UsageError):
    """The namespace's Redis layout is not the one this Keel reads and writes."""

    def __init__(self, namespace: str, found: int, expected: int) -> None:
        self.namespace, self.found, self.expected = namespace, found, expected
        if found > expected:
            advice = ("it was written by a newer Keel: run that version (or newer) for every process of this "
                      "cartridge; see CHANGELOG.md")
        else:
            advice = (f"rebuild it with this version: `keel replay <cartridge folder> --all` (it rewrites every "
                      f"tenant in layout {expected}, then stamps the namespace); see CHANGELOG.md")
        super().__init__(f"Redis namespace {namespace!r} has key layout version {found}, this Keel reads and "
                         f"writes version {expected}: {advice}")


def check_layout(client: Any, namespace: str, *, upgrading: bool = False) -> int:
    """Stamp a namespace without a version; refuse another version (unless `upgrading`, for the replay that
    rewrites the namespace). Returns the version found (after stamping)."""
    key = layout_key(namespace)
    client.set(key, LAYOUT_VERSION, nx=True)
    raw = client.get(key)
    try:
        found = int(raw)
    except (TypeError, ValueError):
        found = 0                       # unreadable: treat as older than any layout
    if found != LAYOUT_VERSION and not (upgrading and found < LAYOUT_VERSION):
        raise LayoutIncompatible(namespace, found, LAYOUT_VERSION)
    return found


def stamp_layout(client: Any, namespace: str) -> None:
    """After a replay of every tenant: the namespace is in the current layout."""
    client.set(layout_key(namespace), LAYOUT_VERSION)
