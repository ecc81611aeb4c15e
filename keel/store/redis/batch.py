"""A commit step between tries of the APPLY script (PendingStep) and what its arguments share with every
writer: the offset field, the latest recorded_at, the refusal when Redis holds less than the writer saw, and
the process-wide cache of timeline prefixes (encoding is the worker's hot path)."""
from __future__ import annotations

import json
from collections.abc import Sequence

from ...errors import StateBehind
from ..base import EventWrites, Position
from .keys import offset_field


class PendingStep:
    """One tenant's apply step between tries: its events (repeated ids dropped), offset, the latest
    recorded_at of its writes, the partition's lag after it (the position's log end, when given) and the offset the
    writer saw the tenant hold (`held`, checked by the APPLY scripts: lua.STEP_HELD). `ids` are the events' ids, in
    order, as the dedupe check listed them (the APPLY arguments reuse the list)."""
    __slots__ = ("events", "field", "held", "ids", "lag", "offset", "tenant")

    def __init__(self, tenant: str, events: Sequence[EventWrites], position: Position | None) -> None:
        self.tenant = tenant
        ids = [event_id for _, event_id in events if event_id]
        if len(set(ids)) == len(ids):           # the usual step: no id twice, the events as they are
            self.events: list[EventWrites] = list(events)
        else:
            seen: set[str] = set()
            self.events = []
            ids = []
            for writes, event_id in events:
                if event_id:
                    if event_id in seen:
                        continue
                    seen.add(event_id)
                    ids.append(event_id)
                self.events.append((writes, event_id))
        self.ids: list[str] = ids
        self.field, self.offset = ("", "0") if position is None else \
            (_offset_field(position[0], position[1]), str(int(position[2])))
        self.lag = "" if position is None or len(position) < 4 or position[3] is None else \
            str(max(0, int(position[3]) - int(position[2]) - 1))
        self.held: int | None = None if position is None or len(position) < 5 else position[4]   # type: ignore[misc]

    def drop(self, applied: set[str]) -> None:
        """Leave out the events whose ids Redis holds already (an APPLY's answer 3)."""
        self.events = [e for e in self.events if e[1] not in applied]
        self.ids = [event_id for event_id in self.ids if event_id not in applied]

    @property
    def offset_arg(self) -> str:
        """ARGV[4] of the APPLY scripts: the offset, and the held one when given (lua.STEP_HELD)."""
        return self.offset if self.held is None else f"{self.offset} {int(self.held)}"


def state_behind(p: PendingStep, stored: str) -> StateBehind:
    """The error of an APPLY answer {4, stored}: the tenant holds less of the partition than `p.held`."""
    topic, partition = json.loads(p.field[1:])
    return StateBehind(f"tenant {p.tenant!r} holds {topic} partition {partition} up to {stored or 'nothing'}, "
                       f"less than the {p.held} the writer saw: Redis lost acknowledged writes",
                       topic=topic, partition=int(partition), held=int(p.held or 0),
                       stored=int(stored) if stored else None, tenant=p.tenant)


def latest_text(latest: int | None) -> str:
    """ARGV[5] of the APPLY script: the latest recorded_at of a step's writes (segments.StepBlocks.latest), digits
    whatever int subclass; "" when none."""
    return "" if latest is None else int.__repr__(int(latest))


_CACHE = 100_000                  # entries of the process-wide encoding caches before they are cleared
_FIELDS: dict[tuple[str, int], str] = {}     # (topic, partition) -> offset field of the meta hash


def _offset_field(topic: str, partition: int) -> str:
    field = _FIELDS.get((topic, partition))
    if field is None:
        if len(_FIELDS) > _CACHE:
            _FIELDS.clear()
        field = _FIELDS[(topic, partition)] = offset_field(topic, partition)
    return field

