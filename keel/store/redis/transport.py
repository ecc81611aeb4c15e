"""Talking to Redis: error translation at the boundary, pipelined commands and script calls in one round trip.

redis-py's pipeline encodes everything before it sends, and costs several Python calls per command; a worker
batch sends a thousand APPLY calls. So on a single node commands are packed by hiredis and sent in groups as
they are produced, while the server runs the first ones.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import redis
from hiredis import pack_command as _pack_command
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError, ResponseError

from ...errors import StoreRefusingWrites, StoreUnavailable

Client = redis.Redis | RedisCluster
_SEND_GROUP = 32                  # pipelined APPLY calls sent together while the next ones are encoded
CHUNK = 500                       # timelines, entities or keys per round trip when walking a whole tenant


def chunks(items: list[Any], size: int = CHUNK) -> Iterator[list[Any]]:
    """Consecutive slices of at most `size` items (what one round trip carries)."""
    for i in range(0, len(items), size):
        yield items[i:i + size]


def is_oom(error: BaseException) -> bool:
    """Whether Redis refused a command for lack of memory (maxmemory reached, policy noeviction)."""
    text = str(error)
    return "OOM" in text or "used memory > 'maxmemory'" in text


# Redis's answers that refuse a write although it is up: (what Keel says, what to do about it)
_REFUSALS = {
    "NOREPLICAS": ("Redis refusing writes: fewer replicas in sync than min-replicas-to-write (NOREPLICAS)",
                   "a replica must catch up or rejoin; writes resume by themselves"),
    "READONLY": ("Redis refusing writes: a read-only replica (READONLY)",
                 "point Keel at the primary, or use a redis+sentinel:// URL"),
    "MISCONF": ("Redis refusing writes: it cannot save its snapshots (MISCONF)", "fix the disk Redis saves to"),
}


def refusal(error: BaseException) -> tuple[str, str] | None:
    """(cause, remedy) when Redis refused a write although it answers; None for any other error."""
    if is_oom(error):
        return ("Redis out of memory: refusing writes", "raise maxmemory or free memory; writes resume by themselves")
    text = str(error)
    for code, said in _REFUSALS.items():
        if text.startswith(code) or f"error: {code} " in text:
            return said
    return None


@contextmanager
def guard(namespace: str, what: str, tenant: str | None = None) -> Iterator[None]:
    """Translate redis errors into StoreUnavailable (naming namespace and tenant) at the boundary."""
    try:
        yield
    except RedisError as e:
        where = f"namespace {namespace!r}" + (f", tenant {tenant!r}" if tenant else "")
        refused = refusal(e)
        if refused is not None:     # the cause, not the queued command that met it (issue 44)
            raise StoreRefusingWrites(f"{refused[0]} ({what}, {where}): {refused[1]}", refusal=refused[0],
                                      tenant=tenant) from e
        raise StoreUnavailable(f"Redis {what} failed ({where}): {type(e).__name__}: {e}", tenant=tenant) from e


def pipelined(client: Client, calls: Iterable[tuple[Any, ...]]) -> list[Any]:
    """Run commands in one round trip; an error answer is returned in place of its result.

    On a single node the commands are packed by hiredis and sent on one pooled connection as they
    come, in groups of `_SEND_GROUP`, so that the server works on the first ones while the next ones
    are encoded; the answers are read at the end. (redis-py's pipeline sends only once everything is
    encoded, and costs several Python calls per command; a batch sends a thousand APPLY calls.)"""
    if not isinstance(client, redis.Redis):
        pipe = client.pipeline(transaction=False)
        for call in calls:
            pipe.execute_command(*call)
        return pipe.execute(raise_on_error=False)
    pool = client.connection_pool
    conn = pool.get_connection()
    try:
        sent = 0
        group: list[bytes] = []
        for call in calls:
            group.append(_pack_command(call))
            if len(group) >= _SEND_GROUP:
                conn.send_packed_command([b"".join(group)])     # one write: one wake-up of the server
                sent += len(group)
                group = []
        if group:
            conn.send_packed_command([b"".join(group)])
            sent += len(group)
        results: list[Any] = []
        for _ in range(sent):
            try:
                results.append(conn.read_response())
            except ResponseError as e:
                results.append(e)
        return results
    except BaseException:
        conn.disconnect()       # answers may be left unread: never hand this connection out again as is
        raise
    finally:
        pool.release(conn)


def eval_many(client: Client, script: Any, calls: Iterable[tuple[list[str], list[Any]]]) -> list[Any]:
    """Run a registered script once per (keys, args): a single call (given as a list) directly, several in
    one round trip per node, each sent as it is produced (`calls` may be a generator, so the server runs
    the first calls while the next are encoded); a script missing on a node is loaded and its calls run
    again."""
    if isinstance(calls, list) and len(calls) == 1:
        return [script(keys=calls[0][0], args=calls[0][1])]
    seen: list[tuple[list[str], list[Any]]] = []

    def commands(items: Iterable[tuple[list[str], list[Any]]]) -> Iterator[tuple[Any, ...]]:
        for keys, args in items:
            seen.append((keys, args))
            yield ("EVALSHA", script.sha, len(keys), *keys, *args)
    results = pipelined(client, commands(calls))
    for _ in range(2):
        missing = []
        for i, result in enumerate(results):
            if isinstance(result, NoScriptError):
                missing.append(i)
            elif isinstance(result, Exception):
                raise result
        if not missing:
            return results
        client.script_load(script.script)
        retried = [seen[i] for i in missing]
        for i, result in zip(missing, pipelined(client, commands(retried))):
            results[i] = result
    raise StoreUnavailable("a script kept missing on the Redis server (SCRIPT FLUSH in a loop?)")
