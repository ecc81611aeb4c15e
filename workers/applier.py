"""Batch logic of a worker, without Kafka: records → events → handlers on the mirror → one commit per tenant.

`plan(records)` parses each record, skips what the durable store already holds (offset <= the tenant's
applied offset for that partition, or an event id already applied), runs the cartridge handler through
the Projector on the tenant's mirror and collects each event's writes. Rejected envelopes and handler
failures become dead letters; they never stop the batch. A record of a version newer than the cartridge knows
stops its partition: it and every later record of that partition are left out of the plan (`BatchPlan.held`;
the worker pauses the partition there, see held.py), nothing of it is dead-lettered or skipped.
`write(plan)` then writes each tenant's events, event ids and last offset in one atomic `commit_batch` step
(several tenants' steps per round trip with `commit_many`); `settle`/`discard` follow with the mirrors.
Nothing here is async: the worker runs planning on one thread and writing on another (see pipeline.py); the
record key must be the envelope's tenant.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from keel.cartridge import Cartridge
from keel.envelope import TENANT
from keel.errors import StateBehind
from keel.projector import Projector
from keel.store.base import GLOBAL_TENANT, BatchStep, EventWrites, Position, Store, went_back
from keel.store.roles import BatchWrites

from .judge import PrefetchKeys, Reveal, judge
from .mirror import Mirrors, TopicPartition
from .offboarded import OffboardedCheck
from .records import Record

COMMIT_CHUNK = 1024         # tenant steps per round trip when the store can pipeline them


@dataclass(frozen=True)
class DeadLetter:
    """A record that cannot be applied, with why; it goes to the dead-letter topic as it came."""
    record: Record
    reason: str
    event_id: str | None = None
    tenant: str | None = None


@dataclass(frozen=True)
class Held:
    """A record of a version of its event type newer than the cartridge knows: its partition stops at it."""
    record: Record
    event_type: str
    version: int
    known: int              # the newest version the cartridge knows

    @property
    def reason(self) -> str:
        return (f"partition {self.record.partition} stopped at offset {self.record.offset}: a record of "
                f"{self.event_type} version {self.version}, newer than this cartridge knows (version {self.known});"
                f" nothing after it is applied until a worker runs a cartridge that knows it")


@dataclass
class TenantBatch:
    """One tenant's share of a batch from one partition: what one `commit_batch` call writes."""
    tenant: str
    topic: str
    partition: int
    events: list[EventWrites] = field(default_factory=list)
    last_offset: int | None = None

    @property
    def position(self) -> Position | None:
        return None if self.last_offset is None else (self.topic, self.partition, self.last_offset)


@dataclass
class BatchPlan:
    """Everything a batch will write, computed before anything is written."""
    tenants: dict[tuple[str, str, int], TenantBatch] = field(default_factory=dict)
    global_notes: list[EventWrites] = field(default_factory=list)
    dead_letters: list[DeadLetter] = field(default_factory=list)
    records: int = 0
    applied: int = 0
    duplicates: int = 0
    skipped: int = 0
    touched: set[str] = field(default_factory=set)
    tag: int = 0                 # the mirrors' tag of its writes (RecordingStore.begin)
    offsets: dict[tuple[str, str, int], int | None] = field(default_factory=dict)    # applied, as planning began
    log_ends: dict[tuple[str, int], int] = field(default_factory=dict)   # (topic, partition) -> log end at fetch
    through: dict[tuple[str, int], int] = field(default_factory=dict)    # (topic, partition) -> last offset planned
    held: dict[tuple[str, int], Held] = field(default_factory=dict)      # (topic, partition) -> where it stopped

    def batch_of(self, tenant: str, record: Record) -> TenantBatch:
        key = (tenant, record.topic, record.partition)
        batch = self.tenants.get(key)
        if batch is None:
            batch = self.tenants[key] = TenantBatch(tenant, record.topic, record.partition)
        return batch


class BatchApplier:
    """Plans and commits batches of one cartridge's records against a durable store, through mirrors."""

    def __init__(self, cartridge: Cartridge, durable: Store, *, writer: BatchWrites | None = None,
                 allow_global_notes: bool = False, max_mirrored_tenants: int = 100_000,
                 reveal: Reveal | None = None, prefetch_keys: PrefetchKeys | None = None) -> None:
        self.cartridge = cartridge
        self.reveal = reveal                            # decrypts sealed personal fields (keel.privacy)
        self.prefetch_keys = prefetch_keys              # asks the key store once for a batch's keys
        self.offboarded = OffboardedCheck(cartridge, durable)
        self.durable = durable                          # mirrors load from it (the planning thread)
        self.writer: BatchWrites = writer if writer is not None else durable     # commits go through it (maybe another thread)
        self.mirrors = Mirrors(durable, max_tenants=max_mirrored_tenants)
        self.recorder = self.mirrors.memory
        self.projector = Projector(cartridge, self.recorder, allow_global_notes=allow_global_notes)
        # (topic, partition) -> the applied watermark this worker last saw stored (set where the partition was
        # positioned, moved by each write): Redis holding less means it lost acknowledged writes (StateBehind)
        self.watermarks: dict[tuple[str, int], int | None] = {}

    # ---- planning -------------------------------------------------------------------------------

    def plan(self, records: list[Record]) -> BatchPlan:
        """Run the handlers of a batch on the mirrors; nothing durable is written. On any error the
        mirrors this batch touched are dropped (they hold writes that were never committed)."""
        plan = BatchPlan(tag=self.recorder.begin())
        try:
            self.offboarded.refresh()
            self.mirrors.prefetch(_tenants_by_key(records))
            if self.prefetch_keys is not None:
                self.prefetch_keys([r.value for r in records])
            through = plan.through
            for record in records:
                plan.records += 1
                if self._plan_record(plan, record):
                    through[(record.topic, record.partition)] = record.offset
        except BaseException:
            self.mirrors.drop(plan.touched)
            raise
        self.mirrors.pin(plan.touched)
        return plan

    def _plan_record(self, plan: BatchPlan, record: Record) -> bool:
        """Plan one record; False when its partition is held (at this record or an earlier one)."""
        if plan.held and (record.topic, record.partition) in plan.held:
            return False
        gone = self.offboarded.refusal(record)      # an offboarded tenant's record (workers/offboarded.py)
        if gone is not None:
            if gone[1]:                             # (its receipt is passed over)
                plan.dead_letters.append(DeadLetter(record._replace(value=gone[0]), gone[1], None,
                                                    record.key.decode("utf-8", "replace") if record.key else None))
            return True
        verdict = judge(self.projector, self.recorder, record, lambda t: self._already_applied(plan, t, record),
                        self.reveal)
        if verdict.outcome == "skipped":
            return True
        if verdict.outcome == "held":
            newer = verdict.version
            assert newer is not None
            plan.held[(record.topic, record.partition)] = Held(record, newer.event_type, newer.version, newer.known)
            return False
        if verdict.outcome == "refused":       # `kept`: the value with personal fields in clear masked
            self._dead(plan, record if verdict.kept is None else record._replace(value=verdict.kept),
                       verdict.reason or "", verdict.event_id, verdict.tenant)
            return True
        tenant, event_id = verdict.tenant or "", verdict.event_id
        batch = plan.batch_of(tenant, record)
        batch.last_offset = record.offset
        if verdict.outcome == "duplicate":
            plan.duplicates += 1
            return True
        plan.applied += 1
        for where, writes, write_id in verdict.writes:
            if where == GLOBAL_TENANT:     # a global note: marked with a tenant-qualified id, so it is idempotent too
                plan.global_notes.append((writes, f"{tenant}/{event_id}"))
            else:
                batch.events.append((writes, write_id or event_id))
        return True

    def _already_applied(self, plan: BatchPlan, tenant: str, record: Record) -> bool:
        key = (tenant, record.topic, record.partition)
        offsets = plan.offsets
        if key in offsets:           # the mirrors' offsets change only when a plan is settled, never during one
            applied = offsets[key]
        else:
            plan.touched.add(tenant)
            applied = offsets[key] = self.mirrors.applied_offset(tenant, record.topic, record.partition)
        if applied is not None and record.offset <= applied:
            plan.skipped += 1
            return True
        return False

    def _dead(self, plan: BatchPlan, record: Record, reason: str, event_id: str | None, tenant: str | None) -> None:
        plan.dead_letters.append(DeadLetter(record, reason, event_id, tenant))
        if tenant is not None:     # its offset counts as handled: a redelivery does not dead-letter it again
            plan.batch_of(tenant, record).last_offset = record.offset

    # ---- committing -----------------------------------------------------------------------------

    @staticmethod
    def steps(plan: BatchPlan) -> list[BatchStep]:
        """The plan's commit steps: global notes first, then one atomic step per tenant (and partition)."""
        steps: list[BatchStep] = []
        if plan.global_notes:
            steps.append((GLOBAL_TENANT, plan.global_notes, None))
        for b in plan.tenants.values():
            position = b.position
            if position is not None:
                end = plan.log_ends.get((b.topic, b.partition))     # the store keeps the lag it implies
                held = plan.offsets.get((b.tenant, b.topic, b.partition))   # as the mirror saw it stored
                steps.append((b.tenant, b.events, (*position, end, held)))
        return steps

    def write(self, plan: BatchPlan) -> None:
        """Commit a plan to the durable store: each tenant's events + ids + offset in one atomic step (steps
        of several tenants share round trips through `commit_many`). Touches no mirror, so it may
        run on another thread while the next batch is planned."""
        self.check_state(plan.through)
        steps = self.steps(plan)
        with self.mirrors.write_lock:        # a mirror reloading from the durable store waits for the batch
            for i in range(0, len(steps), COMMIT_CHUNK):
                chunk = steps[i:i + COMMIT_CHUNK]
                self.writer.commit_many(chunk)
            self.advance(plan.through)
            self.offboarded.written(self.writer)    # an offboarded tenant met in the log: its keys dropped now

    def check_state(self, through: dict[tuple[str, int], int]) -> None:
        """Before any step of a batch: the store still holds each partition as far as this worker saw it stored.
        A batch planned on mirrors loaded after Redis lost writes carries no stale `held` offsets (the mirrors
        read the regressed state), so without this check its steps would land on top of the loss and move
        tenants' offsets past records that must be applied again."""
        by_topic: dict[str, list[int]] = {}
        for (topic, partition) in through:
            if self.watermarks.get((topic, partition)) is not None:
                by_topic.setdefault(topic, []).append(partition)
        for topic, partitions in by_topic.items():
            for partition, stored in self.writer.partitions_applied(topic, partitions).items():
                held = self.watermarks.get((topic, partition))
                if went_back(stored, held):
                    raise StateBehind(f"Redis holds {topic} partition {partition} applied up to {stored}, less than "
                                      f"the {held} this worker wrote: Redis lost acknowledged writes", topic=topic,
                                      partition=partition, held=int(held or 0), stored=stored)

    def advance(self, through: dict[tuple[str, int], int]) -> None:
        """Every record of the partitions up to `through` is in the durable store: move their watermarks (where a
        worker resumes), checking that the store still holds what this worker saw (StateBehind otherwise)."""
        if through:
            held = {tp: self.watermarks.get(tp) for tp in through}
            self.writer.advance_partitions(through, held)
            for tp, offset in through.items():
                self.watermarks[tp] = max(offset, held[tp] if held[tp] is not None else -1)

    def settle(self, plan: BatchPlan) -> None:
        """After `write`: the mirrors' applied offsets follow what the durable store now holds, and they
        forget the plan's writes unless a handler read them (`RecordingStore.release`)."""
        for tenant, _, position in self.steps(plan):
            if position is not None:
                self.mirrors.committed(tenant, position)
        self.recorder.release(plan.touched, plan.tag)
        self.mirrors.unpin(plan.touched)
        self.mirrors.trim()

    def discard(self, plan: BatchPlan | None) -> None:
        """A plan that will not be written as computed: drop the mirrors it changed."""
        if plan is not None:
            self.mirrors.unpin(plan.touched)
            self.mirrors.drop(plan.touched)

    def commit(self, plan: BatchPlan) -> None:
        """write + settle; on failure the plan's mirrors are dropped (Redis may hold part of it)."""
        try:
            self.write(plan)
        except BaseException:
            self.discard(plan)
            raise
        self.settle(plan)

    # ---- ownership ------------------------------------------------------------------------------

    def forget(self, partitions: set[TopicPartition] | None = None) -> int:
        """Drop the mirrors of tenants seen on these partitions (all when None); returns how many."""
        if partitions is None:
            n = len(self.mirrors)
            self.mirrors.clear()
            return n
        return self.mirrors.drop_partitions(partitions)


def _tenants_by_key(records: list[Record]) -> dict[str, set[TopicPartition]]:
    """Tenants the records' keys name (key = tenant on Keel's topics), with the partitions they came from."""
    by_key: dict[bytes, set[TopicPartition]] = {}
    for r in records:
        if r.key:
            by_key.setdefault(r.key, set()).add((r.topic, r.partition))
    out: dict[str, set[TopicPartition]] = {}
    for key, tps in by_key.items():
        tenant = key.decode("utf-8", "replace")
        if TENANT.match(tenant):
            out[tenant] = tps
    return out
