"""A tenant's change log in Redis (Store.changes, Store.change_page).

Per generation `d` (keys.py's data prefix):

    d ch      list of chunks, in apply order: `c<position>|<writes>|<recorded_at>|<body>`

A chunk holds up to CHUNK_WRITES writes of one commit step, in write order. `position` is the log position of
its first write (every write applied is numbered from 0, in apply order), `writes` how many it holds and
`recorded_at` that of its first write; `body` is JSON, compressed (zlib, raw deflate) and base64-encoded:
`[0, run, ...]`, each run a run of writes sharing their provenance:

    run:  [recorded_at, source, evidence, by, point, [key or [key, point, closed, expires_at], value, ...]]

A run's recorded_at is given as the difference from the run before in the chunk (from 0 for the first), and its
writes' points as the run's `point` unless a write says otherwise. A write's key is a JSON list; its owner is ""
when the write before it in the run has the same owner. So a chunk compresses to about 4 bytes a write
(docs/performance.md, "What changed since"). Segments have no per-write address, so the runs carry the writes'
values.

The writer encodes the chunks of a step (`encode_copies`) and the APPLY script (segment_scripts.APPLY) prepends
their positions and appends them to the list in the same atomic step as the writes. The list belongs to the
generation, so a replay rebuilds it with the graph, and dropping the generation drops it. The cold tier's mover
(cold.py) moves the oldest chunks to PostgreSQL and trims them from the list's head: positions stay (each chunk
carries its own), and a page starting below the list's first position reads its chunks from there first (READ
answers 7; `_page`). A tenant's recorded_at
never goes backwards in its log (keel.envelope clamps it), so the first write recorded after a time is in the
last chunk whose first write was recorded at or before it, or the next one: found by bisection. A page (the READ
script) reads the chunks holding its own entries, never a scan of entities.

A generation whose change log was written in an earlier format (one JSON element per write, before chunks; or
layout 1's references) is refused by every read (ChangeLogIncompatible): `keel replay` rebuilds it.
"""
from __future__ import annotations

import re
import zlib
from binascii import a2b_base64, b2a_base64
from collections.abc import Callable, Sequence
from typing import Any, cast

import msgspec

from ...errors import UsageError
from ...timeline import Assertion
from ...times import Micros
from ..base import ChangeEntry, ChangePage, EventWrites, Key
from .changelog_scripts import READ
from .cold import cold_changes
from .keys import gen_keys
from .retries import in_current

CHUNK_WRITES = 256          # writes per chunk at most (a page decodes one or two)
LEVEL = 1                   # zlib's level: its fastest
_digits = int.__repr__      # a time's digits, whatever int subclass carries it (keel.envelope.Instant prints RFC 3339)
_KEYS: dict[Any, str] = {}  # timeline key -> its JSON
_JSON = msgspec.json.Encoder()
_loads = msgspec.json.Decoder().decode
_CACHE = 100_000
_HEAD = re.compile(r"c(\d+)\|(\d+)\|(-?\d+)\|")
_OWNERLESS: dict[Any, str] = {}     # timeline key -> its JSON with owner "" (the write before in its run has it)


class ChangeLogIncompatible(UsageError):
    """A generation's change log is in a format this Keel does not read (written by an earlier build)."""

    def __init__(self, tenant: str, generation: int) -> None:
        super().__init__(f"the change log of tenant {tenant!r} (generation {generation}) was written by an earlier "
                         f"Keel in a format this one does not read: rebuild the tenant with `keel replay <cartridge> "
                         f"--tenant {tenant}` (or `--all`); see CHANGELOG.md")
        self.tenant, self.generation = tenant, generation



# ---- writing ---------------------------------------------------------------------------------------------

def _key_json(key: Key) -> Any:
    """A key's JSON (msgspec.Raw); the same with its owner "" (the run's write before has the same owner) is
    `_OWNERLESS`'s."""
    if len(_KEYS) > _CACHE:
        _KEYS.clear()
        _OWNERLESS.clear()
    kt = _KEYS[key] = msgspec.Raw(_JSON.encode(list(key)))
    _OWNERLESS[key] = msgspec.Raw(_JSON.encode([key[0], "", *key[2:]]))
    return kt


def _plain(obj: Any) -> Any:
    """msgspec's hook for subclasses of JSON's types (keel.times.Instant is an int): their plain value."""
    for kind in (int, float, str):
        if isinstance(obj, kind):
            return kind(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON")


_BODY = msgspec.json.Encoder(enc_hook=_plain).encode
_UNSET = object()


def _chunk(body: list[Any], n: int, rec: Any) -> str:
    """`|<writes>|<recorded_at>|<body>`: the chunk less its position (the APPLY script prepends it)."""
    z = zlib.compress(_BODY(body), LEVEL, -15)
    return f"|{n}|{_digits(rec)}|{b2a_base64(z, newline=False).decode('ascii')}"


def encode_copies(events: Sequence[EventWrites]) -> list[str]:
    """The change-log chunks of one step: runs of writes sharing their provenance, with their values."""
    out: list[str] = []
    keys, ownerless = _KEYS, _OWNERLESS
    body: list[Any] = [0]
    items: list[Any] = []
    first: Any = None
    n = 0
    last_rec = 0
    for writes, _ in events:
        if not writes:
            continue
        ps: Any = _UNSET                        # the run's provenance and point, the write before's owner
        pe = pr = pb = point0 = owner = None
        for key, a in writes:
            point, value, closed, source, evidence, rec, by, expires = a
            if n == CHUNK_WRITES:
                out.append(_chunk(body, n, first))
                body, n, ps, last_rec = [0], 0, _UNSET, 0
            if ps is _UNSET or not (source is ps and evidence is pe and rec == pr and by is pb) and (
                    source, evidence, rec, by) != (ps, pe, pr, pb):
                items = []
                body.append((rec - last_rec, source, evidence, by, point, items))
                ps, pe, pr, pb, last_rec, point0, owner = source, evidence, rec, by, rec, point, None
                if n == 0:
                    first = rec
            kt = keys.get(key)
            if kt is None:
                kt = _key_json(key)
            if key[1] == owner:
                kt = ownerless[key]
            else:
                owner = key[1]
            if closed or expires is not None or point != point0:
                kt = (kt, point, closed, expires)
            add = items.append
            add(kt)
            add(value)
            n += 1
    if n:
        out.append(_chunk(body, n, first))
    return out


# ---- reading ---------------------------------------------------------------------------------------------

def runs_of(element: str) -> tuple[int, int, list[Any]]:
    """(position of the first write, writes, runs) of a chunk; ValueError when it is not one."""
    m = _HEAD.match(element)
    if m is None:
        raise ValueError("not a change-log chunk")
    return int(m.group(1)), int(m.group(2)), cast(list[Any], _loads(zlib.decompress(a2b_base64(element[m.end():]),
                                                                                    -15)))


def _key(item: list[str], owner: str) -> Key:
    return (item[0], owner, *item[2:]) if item[1] == "" else tuple(item)


_new = tuple.__new__


def copies(elements: list[str], start: int, since: Micros | None, count: int) -> list[ChangeEntry]:
    """Up to `count` writes of chunks, from position `start` on, recorded after `since` (None: any)."""
    out: list[ChangeEntry] = []
    for element in elements:
        pos, n, body = runs_of(element)
        if pos + n <= start:
            continue
        rec = 0
        for dr, source, evidence, by, point0, items in body[1:]:
            rec += dr
            k = len(items) // 2
            if pos + k <= start or (since is not None and rec <= since):
                pos += k
                continue
            owner = ""
            for i in range(0, len(items), 2):
                key, value = items[i], items[i + 1]
                point, closed, expires = point0, False, None
                if key[0].__class__ is list:
                    key, point, closed, expires = key
                if key[1]:
                    owner = key[1]
                if pos >= start:
                    a = _new(Assertion, (point, value, bool(closed), source, evidence, rec, by, expires))
                    out.append(_new(ChangeEntry, (pos, _key(key, owner), a)))
                    if len(out) == count:
                        return out
                pos += 1
    return out


Build = Callable[[str], tuple[list[str], list[Any]]]


class ChangeLogReads:
    """`Store.changes` and `Store.change_page` over Redis (a part of RedisBase: its script runner and
    generations)."""

    _changes_script: Any = None
    client: Any                 # RedisStore's
    _script_many: Callable[[Any, Sequence[tuple[str, Build]]], list[list[Any]]]     # RedisStore's
    _gen_guess: Callable[[str], tuple[int, str]]                                        # RedisStore's
    _gens: dict[str, int]
    _n: Callable[[str], Any]

    def changes(self, tenant: str, *, start: int | None = None, since: Micros | None = None,
                generation: int | None = None, count: int) -> ChangePage:
        return self.change_page(tenant, start=start, since=since, generation=generation, count=count)

    def change_page(self, tenant: str, *, start: int | None = None, since: Micros | None = None,
                    generation: int | None = None, count: int, window: int = 0,
                    keep: Callable[[Key], bool] | None = None) -> ChangePage:
        """One READ call for the chunks, which hold each entry's value and provenance (the windows of a page
        are read by windows_many)."""
        if self._changes_script is None:
            self._changes_script = self.client.register_script(READ)
        return in_current(tenant, lambda: self._page(tenant, start, since, generation, count))

    def _page(self, tenant: str, start: int | None, since: Micros | None, generation: int | None,
              count: int) -> ChangePage | None:
        read: dict[str, int] = {}

        def build(d: str) -> tuple[list[str], list[Any]]:
            gen = read["gen"] = int(d.rstrip(":").rpartition(":g")[2])
            read["from_start"] = start is not None and generation == gen
            k = gen_keys(d)
            return ([k.changes, k.meta],
                    ["" if not read["from_start"] else str(start),
                     "" if read["from_start"] or since is None else str(since), str(int(count))])

        [result] = self._script_many(self._changes_script, [(tenant, build)])
        gen = read["gen"]
        code = int(result[0])
        if code == 5:
            raise ChangeLogIncompatible(tenant, gen)
        first, length, elements, kt = int(result[1]), int(result[2]), result[3], result[4]
        known = int(kt) if kt else None
        from_start = bool(read["from_start"])
        at = int(cast(int, start)) if from_start else first
        after = None if from_start else since
        try:
            if code == 7:                       # the page starts below what Redis holds: the cold tier's first
                moved = cold_changes(cast(Any, self), tenant, gen, first, count,
                                     at if from_start else (0 if after is None else None), after)
                if moved is None:
                    return None                 # a cut-over dropped them meanwhile: read the new generation
                elements = [*moved, *elements]
                if not from_start:
                    at = runs_of(moved[0])[0]
            entries = copies(elements, at, after, count)
        except (ValueError, zlib.error, msgspec.DecodeError) as e:
            raise ChangeLogIncompatible(tenant, gen) from e
        if after is not None:
            at = entries[0].position if entries else length
        return ChangePage(gen, at, entries, length, known)
