"""Partitions a worker stopped at a record of a version newer than its cartridge knows (a producer deployed
before the workers): the batch plan leaves the record and everything after it out (workers/applier.py,
BatchPlan.held); here the partition is paused and sought back to that record before the next fetch, so nothing
after it is fetched or applied. Its offset is committed there, with metadata saying why (`keel status` reads
it), one log line says what to deploy, and readiness fails naming it, until a worker running a cartridge that
knows the version takes the partition (a restart, or a rebalance) and applies it, then what follows, in order.
"""
from __future__ import annotations

import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, OffsetAndMetadata, TopicPartition

from .applier import BatchPlan, Held
from .status import commit_metadata


class HeldPartitions:
    """The partitions of one worker's assignment stopped at a newer version."""

    def __init__(self, log: logging.Logger, label: str) -> None:
        self.log = log
        self.label = label
        self.held: dict[TopicPartition, Held] = {}

    def __contains__(self, tp: object) -> bool:
        return tp in self.held

    def hold(self, consumer: AIOKafkaConsumer, plan: BatchPlan) -> None:
        """Pause the plan's held partitions and seek each back to its held record (a rebalance positions them
        at it again, and they stop there again)."""
        assigned = consumer.assignment()
        for (topic, partition), held in plan.held.items():
            tp = TopicPartition(topic, partition)
            if tp not in assigned:
                continue
            consumer.pause(tp)
            consumer.seek(tp, held.record.offset)
            if self.held.get(tp) != held:
                self.log.error("%s: %s. Deploy the cartridge that knows it to the workers (`keel validate "
                               "<cartridge> --kafka` checks it against the log first)", self.label, held.reason)
            self.held[tp] = held

    def offsets(self, plan: BatchPlan, client_id: str) -> dict[TopicPartition, OffsetAndMetadata]:
        """The commits of the plan's held partitions: at the held record, saying why."""
        out = {}
        for (topic, partition), held in plan.held.items():
            why: dict[str, Any] = {"offset": held.record.offset, "type": held.event_type, "version": held.version,
                                   "known": held.known}
            out[TopicPartition(topic, partition)] = OffsetAndMetadata(held.record.offset,
                                                                      commit_metadata(client_id, held=why))
        return out

    def assigned(self, assigned: set[TopicPartition]) -> None:
        """A new assignment: partitions no longer this worker's are held (or not) by their new owners."""
        self.held = {tp: h for tp, h in self.held.items() if tp in assigned}

    def reason(self) -> str | None:
        """Readiness: not ready while a partition is held."""
        held = sorted(self.held.values(), key=lambda h: h.record.partition)
        return "; ".join(h.reason for h in held) or None
