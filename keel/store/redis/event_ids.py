"""A generation's applied event ids and their marks (layout 3): small hashes id -> packed mark, read back exactly.

The APPLY script keeps them in buckets `d e:<b>` by linear hashing (lua.ID_BUCKETS, the bucket rule in Lua;
`id_hash` and `id_bucket` here, with which the writer groups a step's ids by bucket: `id_args`), about 64 ids a
bucket, which Redis keeps as listpacks: about 33 bytes per id and mark instead of ~130 in
a set of ids plus a hash of marks (layout 2). Reads of single ids ask the ID_LOOKUP script, which finds an id's
bucket; reads of every id read every bucket by name, the bucket count (`eb` of the meta hash) in the same
MULTI/EXEC, and again with more buckets when it grew.

A mark (EventId.mark, `<content hash> <where first seen>`, the projector's) is packed exactly, in Python only
(Lua stores it as given): the 16 hex digits of the hash as 11 base64 characters, then the origin: nothing for
"earlier in the log", `L<n>` for "at line <n>", `K<partition>.<offset>.<topic>` for "at <topic> partition <p>
offset <o>" (numbers in base 64), or " " and the origin as it is. A mark of any other shape is kept whole after
"/" (never a base64 character). Unpacking gives back the same string: the Redis store answers as the memory store.
"""
from __future__ import annotations

import binascii
import hashlib
import re
import struct
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

from ...errors import StoreUnavailable
from .keys import BUCKETS, gen_keys
from .lua import IDS_PER_BUCKET
from .retries import RETRIES
from .transport import Client, chunks

EARLIER = "earlier in the log"          # the origin the projector gives an event read from no known place
_TOPIC = re.compile(r"[A-Za-z0-9._-]+")     # a topic a mark's `K` form keeps (any other origin is kept whole)
_DIGITS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"     # base64url's
_VALUE = {c: i for i, c in enumerate(_DIGITS)}
_TO_URL, _FROM_URL = bytes.maketrans(b"+/", b"-_"), bytes.maketrans(b"-_", b"+/")
_GUESSES = 10_000                      # bucket counts remembered (by data prefix) before the cache is cleared
_PARTITIONS: dict[str, tuple[str, str] | None] = {}    # `at <topic> partition <p>` -> the `K` form's parts
_COUNTS: dict[str, tuple[int, int]] = {}    # data prefix -> (ids, buckets) its last APPLY answered (note_counts)
_sha1 = hashlib.sha1
_FIRST32 = struct.Struct(">I").unpack_from
_b2a = binascii.b2a_base64


_PAIRS = [a + b for a in _DIGITS for b in _DIGITS]     # n < 4096 as two digits


def _number(n: int) -> str:
    """n >= 0 in base 64, most significant digit first, no leading zeros (two digits a step)."""
    if n < 64:
        return _DIGITS[n]
    if n < 4096:
        return _PAIRS[n]
    out = _PAIRS[n & 4095]
    n >>= 12
    while n >= 4096:
        out = _PAIRS[n & 4095] + out
        n >>= 12
    return (_DIGITS[n] if n < 64 else _PAIRS[n]) + out


def _value(text: str) -> int:
    n = 0
    for c in text:
        n = n * 64 + _VALUE[c]
    return n


def id_hash(event_id: str) -> int:
    """The hash that picks an id's bucket (lua.ID_BUCKETS' `id_hash`: the first 32 bits of its SHA-1)."""
    return int(_FIRST32(_sha1(event_id.encode()).digest())[0])   # as Lua: tonumber(sub(sha1hex, 1, 8), 16)


def id_bucket(h: int, nb: int) -> int:
    """The bucket of an id of hash `h` among `nb` (lua.ID_BUCKETS' `id_bucket`: linear hashing)."""
    top = 1 << (nb.bit_length() - 1)
    b = h % top
    return h % (2 * top) if b < nb - top else b


def _decimal(text: str) -> bool:
    """Whether `text` is a number the packed forms keep: decimal digits, at most 18, no leading zero but "0"."""
    return text.isdigit() and text.isascii() and len(text) <= 18 and (text[0] != "0" or text == "0")


def _partition(head: str) -> tuple[str, str] | None:
    """What the `K` form keeps around the offset of an origin starting `head` (`at <topic> partition <p>`), None
    when it keeps none; kept in a process-wide cache (a worker's marks name a few partitions) that pack_mark reads
    first."""
    if len(_PARTITIONS) > _GUESSES:
        _PARTITIONS.clear()
    words = head.split(" ")
    known = len(words) == 4 and words[0] == "at" and words[2] == "partition" and _decimal(words[3]) \
        and _TOPIC.fullmatch(words[1]) is not None
    parts = _PARTITIONS[head] = (f"K{_number(int(words[3]))}.", "." + words[1]) if known else None
    return parts


def pack_mark(mark: str | None) -> str:
    """What the store keeps for an event id's mark ("" for none: an id without a mark). By string operations,
    not a regular expression: a worker packs one mark per event."""
    if not mark:
        return ""
    head = mark[:16]
    if mark[16:17] != " ":
        return "/" + mark
    try:
        raw = bytes.fromhex(head)
    except ValueError:
        return "/" + mark
    if raw.hex() != head:                   # upper case, spaces: not the 16 lower-case digits of a content hash
        return "/" + mark
    digest = _b2a(raw, newline=False)[:11].translate(_TO_URL).decode()
    origin = mark[17:]
    if origin == EARLIER:
        return digest
    where, sep, offset = origin.rpartition(" offset ")
    if sep and _decimal(offset):
        parts = _PARTITIONS[where] if where in _PARTITIONS else _partition(where)
        if parts is not None:
            return f"{digest}{parts[0]}{_number(int(offset))}{parts[1]}"
    elif origin[:8] == "at line " and _decimal(origin[8:]) and origin[8] != "0":
        return f"{digest}L{_number(int(origin[8:]))}"
    return digest + mark[16:]


def id_args(d: str, ids: Sequence[str]) -> tuple[str, list[Any]]:
    """A commit step's ids for the APPLY script of data prefix `d` (lua.STEP_IDS): the latest recorded_at they carry
    (keel.store.base.EventId; "" when none does) and the arguments nI, the bucket count after the step's splits as
    guessed from the counts the last APPLY answered (note_counts), then the ids with their packed marks grouped by
    bucket for that count; in one pass. A wrong guess costs Redis a SHA-1 per id, never a wrong answer."""
    latest: Any = None
    n = len(ids)
    ne, nb = _COUNTS.get(d, (0, 1))
    nb = max(nb, -(-(ne + n) // IDS_PER_BUCKET))     # the splits STEP_IDS makes first
    pairs: list[Any] = []                            # id, packed mark, id, packed mark, ...
    add = pairs.append
    for event_id in ids:
        rec = getattr(event_id, "recorded_at", None)
        if rec is not None and (latest is None or rec > latest):
            latest = rec
        add(event_id)
        add(pack_mark(getattr(event_id, "mark", None)))
    if nb == 1 and n:                                # one bucket holds every id: no hash to compute
        return ("" if latest is None else str(latest)), [n, 1, 0, n, *pairs]
    groups: dict[int, list[Any]] = {}
    for i in range(0, 2 * n, 2):
        b = id_bucket(id_hash(pairs[i]), nb)
        group = groups.get(b)
        if group is None:
            groups[b] = pairs[i:i + 2]
        else:
            group += pairs[i:i + 2]
    args: list[Any] = [n, nb]
    for b, group in groups.items():
        args += (b, len(group) >> 1, *group)
    return ("" if latest is None else str(latest)), args


def note_counts(d: str, ne: Any, nb: Any) -> None:
    """Keep the ids applied and the buckets of data prefix `d` an APPLY answered: id_args' next guess."""
    if len(_COUNTS) > _GUESSES:
        _COUNTS.clear()
    _COUNTS[d] = (int(ne), int(nb))


def unpack_mark(value: str) -> str | None:
    """The mark pack_mark kept as `value` (None for "")."""
    if not value:
        return None
    if value[0] == "/":
        return value[1:]
    digest = binascii.a2b_base64(value[:11].encode().translate(_FROM_URL) + b"=").hex()
    code = value[11:12]
    if not code:
        return f"{digest} {EARLIER}"
    if code == "L":
        return f"{digest} at line {_value(value[12:])}"
    if code == "K":
        partition, offset, topic = value[12:].split(".", 2)
        return f"{digest} at {topic} partition {_value(partition)} offset {_value(offset)}"
    return f"{digest}{value[11:]}"


class EventIdReads:
    """The applied ids and marks of RedisBase (a mixin over its client, guard, transactions and scripts)."""

    _client: Client
    _id_lookup: Any                         # lua.ID_LOOKUP, registered
    _guard: Callable[..., AbstractContextManager[None]]
    _tx: Callable[[str, Callable[[Any, str], None]], list[Any]]
    _script_many: Callable[..., list[list[Any]]]

    def has_event(self, tenant: str, event_id: str) -> bool:
        with self._guard("has_event", tenant):
            return self._lookup(tenant, [event_id])[0] is not None

    def event_mark(self, tenant: str, event_id: str) -> str | None:
        with self._guard("event_mark", tenant):
            value = self._lookup(tenant, [event_id])[0]
        return None if value is None else unpack_mark(value)

    def event_ids(self, tenant: str) -> list[str]:
        with self._guard("event_ids", tenant):
            return sorted(self._all_ids(tenant))

    def event_marks(self, tenant: str) -> dict[str, str]:
        with self._guard("event_marks", tenant):
            packed = self._all_ids(tenant)
        return {event_id: mark for event_id, value in packed.items() if (mark := unpack_mark(value)) is not None}

    def _lookup(self, tenant: str, ids: Sequence[str]) -> list[str | None]:
        """The packed mark ("" none) of each id, None for one not applied, from the current generation."""
        out: list[str | None] = []
        for chunk in chunks(list(ids), 2000):
            [result] = self._script_many(self._id_lookup, [(tenant, lambda d, ids=chunk: ([gen_keys(d).meta], ids))])
            out += result[1:]
        return out

    def _all_ids(self, tenant: str) -> dict[str, str]:
        """Every applied id of the current generation -> its packed mark, in one MULTI/EXEC (again with more
        buckets when they were more than guessed)."""
        asked: list[tuple[str, int]] = []

        def fill(pipe: Any, d: str) -> None:
            pipe.hget(gen_keys(d).meta, BUCKETS)
            asked.append((d, self.queue_buckets(pipe, d)))
        for _ in range(RETRIES):
            result = self._tx(tenant, fill)
            d, guess = asked[-1]
            got = self.take_buckets(d, guess, result[0], result[1:])
            if got is not None:
                return got
        raise StoreUnavailable(f"the event ids of tenant {tenant!r} kept growing while read", tenant=tenant)

    # ---- reading every bucket (here and in a worker's tenant starts: starts.py) ------------------------

    _id_guesses: dict[str, int]

    def queue_buckets(self, pipe: Any, d: str) -> int:
        """Queue an HGETALL of each bucket of generation `d` as far as guessed; returns the guess."""
        guess = self._id_guesses.get(d, 1)
        k = gen_keys(d)
        for b in range(guess):
            pipe.hgetall(k.id_bucket(b))
        return guess

    def take_buckets(self, d: str, guess: int, count: Any, buckets: Sequence[dict[str, str]]) -> dict[str, str] | None:
        """The ids -> packed marks of the buckets read (queue_buckets), or None when the bucket count read in the
        same transaction (`count`, `eb` of the meta hash) is above the guess (the guess is raised: read again)."""
        n = int(count or 1)
        if n > guess:
            if len(self._id_guesses) > _GUESSES:
                self._id_guesses.clear()
            self._id_guesses[d] = n + n // 16 + 1         # room for the buckets a writer adds meanwhile
            return None
        out: dict[str, str] = {}
        for bucket in buckets:
            out.update(bucket)
        return out


__all__ = ["EARLIER", "EventIdReads", "id_args", "id_bucket", "id_hash", "note_counts", "pack_mark", "unpack_mark"]
