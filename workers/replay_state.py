"""The in-progress marker of a replay: which shadow generation of a tenant is being built, and by whom.

One small Redis key per tenant, `keel:{<ns>/<tenant>}:replay` (keel/store/redis/keys.py: the tenant's hash tag,
so it lives in the tenant's slot), holding JSON `{"gen", "old", "host", "pid", "seen"}`. A replay claims it
before writing its shadow, refreshes `seen` while it works and deletes it when done. A rerun after an
interruption (Ctrl-C, kill -9) finds it and drops the abandoned shadow before starting again; a live claim
(another replay of the same tenant, still running) is refused.
"""
from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass
from typing import Any

from keel.errors import UsageError
from keel.store.redis import RedisStore, guard

STALE_AFTER_S = 30.0        # a claim not refreshed for this long is abandoned, whatever host holds it


@dataclass(frozen=True)
class Claim:
    """A replay's marker: the shadow generation `gen` built to replace generation `old`."""
    gen: int
    old: int
    host: str
    pid: int
    seen: float

    def alive(self, now: float) -> bool:
        """Whether the replay holding it may still be running."""
        if now - self.seen > STALE_AFTER_S:
            return False
        if self.host == socket.gethostname():
            try:
                os.kill(self.pid, 0)
            except ProcessLookupError:
                return False
            except PermissionError:
                return True
        return True


class ReplayState:
    """Reads and writes the replay markers of one namespace (cartridge) through a RedisStore's client."""

    def __init__(self, store: RedisStore) -> None:
        self.store = store
        self.client: Any = store.client

    def key(self, tenant: str) -> str:
        return self.store.tenant_keys(tenant).replay

    def get(self, tenant: str) -> Claim | None:
        with guard(self.store.namespace, "read replay marker", tenant):
            raw = self.client.get(self.key(tenant))
        if raw is None:
            return None
        doc = json.loads(raw)
        return Claim(int(doc["gen"]), int(doc["old"]), str(doc["host"]), int(doc["pid"]), float(doc["seen"]))

    def put(self, tenant: str, gen: int, old: int) -> None:
        """Claim (or refresh the claim on) the tenant's shadow generation `gen`."""
        doc = {"gen": gen, "old": old, "host": socket.gethostname(), "pid": os.getpid(), "seen": time.time()}
        with guard(self.store.namespace, "write replay marker", tenant):
            self.client.set(self.key(tenant), json.dumps(doc))

    def clear(self, tenant: str) -> None:
        with guard(self.store.namespace, "delete replay marker", tenant):
            self.client.delete(self.key(tenant))

    def recover(self, tenant: str) -> int:
        """Before a replay: refuse when another one is running; else drop what an interrupted one left (its
        shadow, or the old generation when it had already switched) and every other orphaned generation.
        Returns the number of keys deleted."""
        claim = self.get(tenant)
        if claim is not None and claim.alive(time.time()) and claim.pid != os.getpid():
            raise UsageError(f"tenant {tenant!r} is being replayed already (pid {claim.pid} on {claim.host}, "
                             f"shadow generation {claim.gen}); wait for it, or retry in {STALE_AFTER_S:.0f}s "
                             f"if it was killed")
        deleted = self.drop_orphans(tenant)
        if claim is not None:
            self.clear(tenant)
        return deleted

    def drop_orphans(self, tenant: str) -> int:
        """Drop every generation of the tenant that holds keys but is not the current one."""
        current = self.store.current_generation(tenant)
        with guard(self.store.namespace, "read generation sequence", tenant):
            highest = int(self.client.get(self.store.tenant_keys(tenant).gseq) or 1)
        deleted = 0
        for gen in range(1, max(highest, current) + 1):
            if gen == current:
                continue
            names = self.store.tenant_keys(tenant).data_keys(gen)        # the generation's index keys
            with guard(self.store.namespace, "probe generation", tenant):
                present = int(self.client.exists(*names))
            if present:
                deleted += self.store.drop_generation(tenant, gen)
        return deleted
