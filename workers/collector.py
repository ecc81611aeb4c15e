"""The cyclic garbage collector's young-generation threshold for the processes that hold batches of records
in flight (`keel worker`, `keel replay`): one rule, measured in docs/performance.md."""
from __future__ import annotations

GC_OBJECTS_PER_RECORD = 100     # room per record of a batch before a young-generation collection


def gc_young_threshold(batch: int) -> int:
    """When the collector scans the young generation: after this many more container objects were made than
    freed; `batch` is the records a process keeps in flight (a worker's batch, a replay's fetch). A batch's
    records, events and writes live until the batch is written (two batches in flight, ~20-50 objects per record), so with a fixed 100,000 the collector ran several times per batch, each time
    scanning the whole batch in flight, only to find it alive: 12-18% of the worker's CPU (docs/performance.md).
    Counted net of frees, a threshold above two batches' objects lets a collection come only when what is kept
    (mirrors) grows by that much; reference cycles, the only garbage that waits for it, are few here."""
    return max(100_000, GC_OBJECTS_PER_RECORD * batch)
