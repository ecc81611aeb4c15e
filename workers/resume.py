"""Where a worker resumes a partition: from what Redis holds, never from a Kafka commit that is ahead of it.

Redis keeps, with each batch's writes, the partition's applied watermark (Store.advance_partitions): every
record up to it is applied. The consumer group's committed offset is only a hint: it is committed after Redis
acknowledged a batch, but a Redis that fails over to a replica that lagged, or is restored from an older
backup, holds less than the commit says. Resuming from the commit would skip what Redis lost, silently.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Resume:
    """The decision for one partition. `start` is the offset to seek to (None: no seek, the consumer's own
    reset applies, or from the beginning when `how` is "beginning"); `behind` how many records the commit
    was ahead of the state (0 when it was not, or unknown)."""
    partition: int
    how: str            # "state" | "committed" | "beginning" | "new"
    start: int | None
    behind: int

    def describe(self) -> str:
        """The log line of a decision worth one: Redis behind the log, or a namespace without watermarks."""
        p = self.partition
        if self.how == "committed":
            return (f"partition {p} has no applied watermark in Redis yet (a namespace written before watermarks); "
                    f"resuming from the committed offset {self.start}")
        where = ("Redis holds no watermark of it (restarted empty, a replica that never had it, or restored from "
                 "before it): re-applying the partition from its beginning" if self.how == "beginning" else
                 f"Redis holds it through offset {(self.start or 1) - 1} (a failover to a replica that lagged, or an "
                 f"older backup): re-applying from offset {self.start}")
        return (f"Redis is behind the log on partition {p} by {self.behind} record(s): the group committed offset "
                f"{self.behind + (self.start or 0)}, {where}")


def decide(partition: int, watermark: int | None, committed: int | None, predates_watermarks: bool) -> Resume:
    """The rule. A watermark: resume after it (records between it and the commit are applied again: redelivered
    records of tenants Redis still holds are skipped by their own offsets and ids). No watermark: nothing of
    the partition is applied, and it is read from its beginning ("new" without a commit; "beginning" with
    one: Redis lost it, restarted empty or failed over to a replica that never had it). The one exception is
    a namespace written before watermarks existed (`Store.predates_watermarks`): it resumes from the commit
    (its first batch stores a watermark). Every decision seeks: a worker that rewinds after Redis lost writes
    has read the partition already, so the consumer's reset policy would not apply."""
    if watermark is not None:
        start = watermark + 1
        return Resume(partition, "state", start, max(0, committed - start) if committed is not None else 0)
    if committed is None:
        return Resume(partition, "new", None, 0)
    if predates_watermarks:
        return Resume(partition, "committed", committed, 0)
    return Resume(partition, "beginning", None, committed)
