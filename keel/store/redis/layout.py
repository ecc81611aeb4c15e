"""The Redis key layout's version, checked by every process when it opens a namespace.

`keel:{<namespace>}:layout` holds the layout version the namespace was written with (same hash tag as the
namespace's tenant registry). This Keel reads and writes one layout, version 3 (segments appended per step:
segments.py, segment_store.py; event ids and their marks in small bucketed hashes: event_ids.py). A namespace
without the stamp is new, and is stamped 3, or was written by a Keel from before the stamp, whose layout was
version 1. Layouts 1 (a sorted set per entity) and 2 (segments, with the event ids in one set and their marks in
one hash) were removed: a namespace in either, or in a version this Keel does not know, is refused with one line
saying what to run, never read or written in a mix of two layouts. `keel replay <cartridge> --all` (the only
opener that may meet an older layout: `upgrading`) rewrites every tenant in layout 3, drops the old generations
with their old keys (generations.droppable_keys) and then stamps the namespace. A new namespace is also marked
`watermarked` before its first write: its partitions' applied watermarks are complete, so a worker trusts them
over any Kafka commit (workers/resume.py). CHANGELOG.md lists each layout change and its upgrade step.
"""
from __future__ import annotations

from typing import Any

from ...errors import UsageError
from .keys import layout_key, registry_key, watermarked_key

LAYOUT_VERSION = 3                # the one layout this Keel reads and writes
BEFORE_STAMP = 1                  # the layout of a namespace written before the stamp existed


class LayoutIncompatible(UsageError):
    """The namespace's Redis layout is not the one this Keel reads and writes (exit 2)."""

    def __init__(self, namespace: str, found: int) -> None:
        self.namespace, self.found = namespace, found
        if found > LAYOUT_VERSION:
            advice = ("it was written by a newer Keel: run that version (or newer) for every process of this "
                      "cartridge; see CHANGELOG.md")
        else:
            advice = ("stop its workers and tools servers and run `keel replay <cartridge folder> --all` once: it "
                      f"rewrites every tenant in layout {LAYOUT_VERSION} from the log; see CHANGELOG.md")
        super().__init__(f"Redis namespace {namespace!r} is in key layout {found}, this Keel reads and writes "
                         f"layout {LAYOUT_VERSION} only: {advice}")


def check_layout(client: Any, namespace: str, *, upgrading: bool = False) -> int:
    """Stamp a namespace without a version (LAYOUT_VERSION when it holds no tenant yet, else BEFORE_STAMP);
    refuse any other version than LAYOUT_VERSION, except an older one when `upgrading` (the replay that rewrites
    the namespace). Returns the version found (after stamping)."""
    key = layout_key(namespace)
    if client.get(key) is None:
        begun = bool(client.exists(registry_key(namespace)))
        if not begun:            # before its first write: every write of this namespace is under a watermark
            client.set(watermarked_key(namespace), 1, nx=True)
        client.set(key, LAYOUT_VERSION if not begun else BEFORE_STAMP, nx=True)
    found = namespace_layout(client, namespace) or 0        # unreadable: older than any layout
    if found != LAYOUT_VERSION and not (upgrading and found < LAYOUT_VERSION):
        raise LayoutIncompatible(namespace, found)
    return found


def namespace_layout(client: Any, namespace: str) -> int | None:
    """The layout version a namespace is stamped with (None: none yet; 0: unreadable)."""
    raw = client.get(layout_key(namespace))
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return 0


def stamp_layout(client: Any, namespace: str) -> None:
    """After a replay of every tenant: the namespace is in this Keel's layout."""
    client.set(layout_key(namespace), LAYOUT_VERSION)
