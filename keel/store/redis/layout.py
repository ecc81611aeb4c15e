"""The versions of the Redis key layout, checked by every process when it opens a namespace.

`keel:{<namespace>}:layout` holds the layout version the namespace was written with (same hash tag as the
namespace's tenant registry). A namespace without it is new, or was written by a Keel from before the stamp
(whose layout is version 1): it is stamped with the layout asked for (`KEEL_REDIS_LAYOUT`, default 1) when
new, with 1 when it holds tenants. A new namespace is also marked `watermarked` before its first write: its
partitions' applied watermarks are complete, so a worker trusts them over any Kafka commit (workers/resume.py). This Keel reads and writes layouts 1 (store.py: a sorted set per entity)
and 2 (segment_store.py: segments appended per step); a process opens the store class of the namespace's
layout, and refuses another version with a message saying what to run, instead of reading keys it does not
understand or writing a mix of two layouts. CHANGELOG.md lists each layout change and its upgrade step.
"""
from __future__ import annotations

from typing import Any

from ...errors import UsageError
from .keys import layout_key, registry_key, watermarked_key

LAYOUT_VERSION = 1                # the layout of a namespace written before the stamp, and the default
LAYOUTS = (1, 2)                  # the layouts this Keel reads and writes


class LayoutIncompatible(UsageError):
    """The namespace's Redis layout is not one this Keel reads and writes."""

    def __init__(self, namespace: str, found: int, expected: int) -> None:
        self.namespace, self.found, self.expected = namespace, found, expected
        if found > max(LAYOUTS):
            advice = ("it was written by a newer Keel: run that version (or newer) for every process of this "
                      "cartridge; see CHANGELOG.md")
        else:
            advice = (f"rebuild it with this version: `keel replay <cartridge folder> --all` (it rewrites every "
                      f"tenant in layout {expected}, then stamps the namespace); see CHANGELOG.md")
        super().__init__(f"Redis namespace {namespace!r} has key layout version {found}, this Keel reads and "
                         f"writes versions {', '.join(map(str, LAYOUTS))}: {advice}")


def check_layout(client: Any, namespace: str, *, upgrading: bool = False, default: int = LAYOUT_VERSION) -> int:
    """Stamp a namespace without a version (`default` when it holds no tenant yet, else 1); refuse a version
    this Keel does not read (unless `upgrading`, for the replay that rewrites the namespace). Returns the
    version found (after stamping)."""
    if default not in LAYOUTS:
        raise UsageError(f"bad Redis key layout {default!r}: this Keel writes layouts {', '.join(map(str, LAYOUTS))}")
    key = layout_key(namespace)
    if client.get(key) is None:
        begun = bool(client.exists(registry_key(namespace)))
        if not begun:            # before its first write: every write of this namespace is under a watermark
            client.set(watermarked_key(namespace), 1, nx=True)
        client.set(key, default if not begun else LAYOUT_VERSION, nx=True)
    raw = client.get(key)
    try:
        found = int(raw)
    except (TypeError, ValueError):
        found = 0                       # unreadable: treat as older than any layout
    if found not in LAYOUTS and not (upgrading and found < LAYOUT_VERSION):
        raise LayoutIncompatible(namespace, found, default)
    return found


def stamp_layout(client: Any, namespace: str, layout: int = LAYOUT_VERSION) -> None:
    """After a replay of every tenant: the namespace is in `layout`."""
    client.set(layout_key(namespace), layout)
