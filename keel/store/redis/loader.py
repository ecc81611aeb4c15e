"""Bulk loads of a generation nobody reads yet (a replay's shadow), without the APPLY script.

`BulkLoader` is what a replay uses of a loader in either layout (`RedisStore.load_generation` gives one:
`GenerationLoader` below in layout 1, segment_loader.SegmentLoader in layout 2).

GenerationLoader uses only the store's public interface (`LoadTarget`: client, data_prefix, current_generation,
register_tenant, invalidate) and the batch encoder shared with APPLY, so both leave the same keys.
"""
from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

import hiredis
import redis
from redis.cluster import RedisCluster

from ...errors import StoreUnavailable, UsageError
from ..base import EventWrites, Position
from .batch import PendingStep, latest_of
from .bulk import Entities, encode_step, push
from .changelog import CHANGES, encode_references, positioned
from .keys import LATEST, LAYOUT1_DATA_KEYS, MARKS, RELATION_ENDS
from .transport import Client, guard

_MULTI, _EXEC = hiredis.pack_command(("MULTI",)), hiredis.pack_command(("EXEC",))


class LoadTarget(Protocol):
    """What a loader needs of its store (RedisStore has it): the namespace, the client, a generation's key
    prefix, the current generation, the tenant registry and the store's cache of a generation."""
    namespace: str

    @property
    def client(self) -> Client: ...

    def data_prefix(self, tenant: str, gen: int) -> str: ...

    def current_generation(self, tenant: str) -> int: ...

    def register_tenant(self, tenant: str) -> None: ...

    def invalidate(self, tenant: str, gen: int) -> None: ...


class BulkLoader(Protocol):
    """A bulk loader of one empty generation of one tenant (`RedisStore.load_generation`): it takes the steps
    `commit_batch` would, writes them in order, each atomic, and never writes one twice."""

    @property
    def pending(self) -> int:
        """Steps not known to be written yet."""
        ...

    def add(self, events: Sequence[EventWrites], position: Position | None) -> None:
        """Queue one step, as `commit_batch(tenant, events, position)` takes it."""
        ...

    def flush(self, wait: bool = True) -> None:
        """Write the queued steps; `wait=False` may return before Redis answered (the next flush raises
        their error, with the steps not written queued again)."""
        ...

    def abort(self) -> None:
        """Give up: once this returns, no step is in flight."""
        ...

    def close(self) -> None:
        """Wait for the steps in flight (their error is the next flush's) and free what the loader holds."""
        ...


class _LoadStep:
    """One step of a GenerationLoader, encoded as plain commands."""
    __slots__ = ("bump", "commands")

    def __init__(self, commands: list[tuple[str, ...]], bump: int) -> None:
        self.commands = commands
        self.bump = bump              # 1 when the step moves the write counter `sv` (as APPLY would)


class GenerationLoader(BulkLoader):
    """Bulk writes into a generation nobody reads yet (a replay's shadow): the steps `commit_batch` would
    apply, as plain commands (ZADD, RPUSH, SADD, LSET, HSET, HINCRBY) instead of the APPLY script.

    The loader keeps in process what APPLY finds out on the server: the provenance list's length, which
    timelines and entities exist, every entity's first recorded_at, the applied event ids and offsets. So it
    sends no reads, and the generation ends exactly as APPLY of the same steps would leave it (same keys,
    members, lists and counters), ready for APPLY to go on from there.

    `add` only encodes a step (CPU). `flush` sends the queued steps on the loader's own connection, each in
    one MULTI/EXEC (its keys share the tenant's hash tag), packed by hiredis in one write: redis-py's pipeline
    costs more per command than the commands themselves. `flush(wait=False)` leaves the last step's answer
    unread, so Redis executes it while the caller encodes the next one. After a failure, the next flush asks
    the write counter which of the unanswered steps were executed (steps execute whole and in order) and
    sends the others: nothing is written twice.
    """

    def __init__(self, store: LoadTarget, tenant: str, gen: int) -> None:
        self.store = store
        self.tenant = tenant
        self.gen = int(gen)
        self.d = store.data_prefix(tenant, self.gen)
        self.base = 0                          # provenance entries, once the queued steps are written
        self.logged = 0                        # writes in the change log, once the queued steps are written
        self.sv = 0                            # the write counter as the server has it
        self.entities = Entities(self.d)       # first recorded_at of each entity, timelines with members
        self.ids: set[str] = set()             # applied event ids
        self.latest = -(2 ** 63)               # the latest recorded_at written (`m` field LATEST)
        self.offsets: dict[str, int] = {}      # offset field -> offset
        self.written = False                   # a queued step writes (the first one says `re` is kept)
        self.known_through = -1                # the meta hash's `kt` as the queued steps leave it
        self.queue: list[_LoadStep] = []       # steps not known to be written, in order
        self.sent = 0                          # of them, sent on `conn` and not answered yet
        self.unsure = False                    # a failure left the queued steps' fate unknown
        self.conn: Any = None
        self.conn_id: str | None = None        # its CLIENT ID, while steps sent on it may be unanswered
        self.pool: Any = None
        d = self.d
        if self.gen == store.current_generation(tenant):
            raise UsageError(f"generation {gen} is the current generation of tenant {tenant!r}: a bulk "
                             f"load writes only a generation nobody reads")
        with self._guard():
            if int(store.client.exists(*(d + k for k in (*LAYOUT1_DATA_KEYS, MARKS)))):
                raise UsageError(f"generation {gen} of tenant {tenant!r} holds data: a bulk load starts from "
                                 f"an empty generation")
        store.register_tenant(tenant)

    def _guard(self) -> AbstractContextManager[None]:
        return guard(self.store.namespace, "load_generation", self.tenant)

    @property
    def pending(self) -> int:
        """Steps not known to be written yet."""
        return len(self.queue)

    def add(self, events: Sequence[EventWrites], position: Position | None) -> None:
        """Queue one step, as `commit_batch(tenant, events, position)`: events whose id was applied before
        (or earlier in the step) are skipped whole, and the offset only moves forward."""
        p = PendingStep(self.tenant, events, position)
        ids = self.ids
        kept = [e for e in p.events if not e[1] or e[1] not in ids]
        new_ids = [event_id for _, event_id in kept if event_id]
        ids.update(new_ids)
        d = self.d
        commands: list[tuple[str, ...]] = []
        wrote = False
        if kept:
            provs, ends, wrote = encode_step(kept, self.base, self.entities, commands)
            push(commands, "SADD", d + RELATION_ENDS, ends)
            push(commands, "RPUSH", d + "pv", provs)
            logged, self.logged = positioned(encode_references(kept, self.base), self.logged)
            push(commands, "RPUSH", d + CHANGES, logged)      # the change log (changelog.py)
            self.base += len(provs)
            push(commands, "SADD", d + "ev", new_ids)
            marks = [x for event_id in new_ids if getattr(event_id, "mark", None) for x in (event_id, event_id.mark)]
            if marks:
                push(commands, "HSET", d + MARKS, marks)
            latest = latest_of(new_ids)
            if latest and int(latest) > self.latest:
                self.latest = int(latest)
                commands.append(("HSET", d + "m", LATEST, latest))
        bump = 1 if new_ids or wrote else 0
        if bump:
            commands.append(("HINCRBY", d + "m", "sv", "1"))
            if not self.written:            # the generation's first write, as APPLY marks it
                self.written = True
                commands.append(("HSET", d + "m", RELATION_ENDS, "1"))
        if kept and p.latest and int(p.latest) > self.known_through:
            self.known_through = int(p.latest)
            commands.append(("HSET", d + "m", "kt", p.latest))
        if p.field:
            offset = int(p.offset)
            if offset > self.offsets.get(p.field, -1):
                self.offsets[p.field] = offset
                commands.append(("HSET", d + "m", p.field, p.offset))
                if p.lag:
                    commands.append(("HSET", d + "m", "lag", p.lag))
        if commands:
            self.queue.append(_LoadStep(commands, bump))

    def flush(self, wait: bool = True) -> None:
        """Send the queued steps, in order, and wait until every one is written; without `wait`, wait only
        for those sent before, and leave the new ones executing while the caller goes on. StoreUnavailable
        when Redis fails: flush again (it goes on where it stopped)."""
        with self._guard():
            try:
                if self.unsure:
                    self._recover()
                if not self.queue:
                    self.close()
                    return
                if self.conn is None:
                    self._connect()
                if not wait:
                    self._answers(self.sent)
                while self.sent < len(self.queue):
                    self.sent += 1                       # counted before: a failed send may have gone through
                    self._send(self.queue[self.sent - 1].commands)
                if wait:
                    self._answers(self.sent)
                    self.close()
            except BaseException:
                self.unsure = self.unsure or bool(self.sent)
                self.sent = 0
                if self.conn is not None:
                    self.conn.disconnect()               # mid-answer: the connection is unusable
                self.close()
                raise
        self.store.invalidate(self.tenant, self.gen)

    def _recover(self) -> None:
        """After a failure: drop from the queue the steps the server executed (the write counter tells how
        many of those moving it; offset-only steps before them went too, and resending others is harmless).
        The failed connection is killed first, so that no step it sent can still execute after the count."""
        node = self._node()
        if self.conn_id is not None:
            node.execute_command("CLIENT", "KILL", "ID", self.conn_id)
            self.conn_id = None
        executed = int(node.hget(self.d + "m", "sv") or 0) - self.sv
        while self.queue and executed > 0:
            step = self.queue.pop(0)
            self.sv += step.bump
            executed -= step.bump
        self.unsure = False

    def _node(self) -> redis.Redis:
        """The client of the node owning the tenant's slot."""
        client = self.store.client
        if isinstance(client, RedisCluster):
            return client.get_redis_connection(client.get_node_from_key(self.d))
        return client

    def _connect(self) -> None:
        self.pool = self._node().connection_pool
        self.conn = self.pool.get_connection()
        self.conn.send_command("CLIENT", "ID")
        self.conn_id = str(self.conn.read_response())

    def _send(self, commands: list[tuple[str, ...]]) -> None:
        pack = hiredis.pack_command
        self.conn.send_packed_command([b"".join([_MULTI, *(pack(c) for c in commands), _EXEC])])   # one sendall

    def _answers(self, steps: int) -> None:
        """Read the answers of the first `steps` steps sent: OK, QUEUED per command, then EXEC's, each."""
        for _ in range(steps):
            self._answer(len(self.queue[0].commands))
            self.sent -= 1
            self.sv += self.queue.pop(0).bump

    def _answer(self, n: int) -> None:
        read = self.conn.read_response
        for _ in range(n + 1):
            read()
        if read() is None:
            raise StoreUnavailable(f"a bulk load step of tenant {self.tenant!r} was aborted", tenant=self.tenant)

    def abort(self) -> None:
        """Give up (before dropping the generation): once this returns, no step sent and not answered can
        still run, as their connection is killed on the server."""
        with self._guard():
            try:
                if self.conn_id is not None and (self.sent or self.unsure):
                    self._node().execute_command("CLIENT", "KILL", "ID", self.conn_id)
            finally:
                self.close()
        self.queue.clear()

    def close(self) -> None:
        """Give the connection back (steps sent and not answered are then unsure: the next flush checks)."""
        if self.conn is not None:
            if self.sent:
                self.conn.disconnect()
                self.unsure, self.sent = True, 0
            if not self.unsure:
                self.conn_id = None
            self.pool.release(self.conn)
            self.conn = None


