"""A tenant's change log in Redis (Store.changes, Store.change_page), both key layouts.

Per generation `d` (keys.py's data prefix):

    d ch      list of chunks, in apply order: `c<position>|<writes>|<recorded_at>|<body>`

A chunk holds up to CHUNK_WRITES writes of one commit step, in write order. `position` is the log position of
its first write (every write applied is numbered from 0, in apply order), `writes` how many it holds and
`recorded_at` that of its first write; `body` is JSON, compressed (zlib, raw deflate) and base64-encoded:
`[w, run, ...]`, each run a run of writes sharing their event and recorded_at (layout 1) or their provenance
(layout 2). A run's recorded_at (and layout 1's `b`) is given as the difference from the run before in the chunk
(from 0 for the first), and its writes' points as the run's `point` unless a write says otherwise. A write's key
is a JSON list; its owner is "" when the write before it in the run has the same owner. So a chunk compresses to
about 4 bytes a write (docs/performance.md, "What changed since").

    layout 1 run:  [recorded_at, b, point, [key or [key, point], ...]]
    layout 2 run:  [recorded_at, source, evidence, by, point, [key or [key, point, closed, expires_at], value,
                    ...]]                                                              (its chunk's `w` is 0)

Layout 1 keeps references: the writes of a chunk are the step's writes w, w + 1, ... (batch.encode_writes counts
them from 1) and a write of a run is the member `<P><point9><#b><b><#w><w>...` of its owner's sorted set
(keys.py); the member and the provenance list hold its value and provenance, read back by the AROUND script with
the window of each change (what keel/changes.py builds a row from). Layout 2 has no per-write address in its
segments, so its runs carry the writes' values.

The writer encodes the chunks of a step (`encode_references`, `encode_copies`) and each layout's APPLY script
prepends their positions and appends them to the list in the same atomic step as the writes (layout 1:
scripts.APPLY; layout 2: segment_scripts.APPLY; a layout-1 bulk load, the only writer of its generation, numbers
them itself: `positioned`). The list belongs to the generation, so a replay rebuilds it with the graph, and
dropping the generation drops it. In layout 2 the cold tier's mover (cold.py) moves the oldest chunks to
PostgreSQL and trims them from the list's head: positions stay (each chunk carries its own), and a page starting
below the list's first position reads its chunks from there first (READ answers 7; `_page`). A tenant's recorded_at never goes backwards in its log (keel.envelope clamps
it), so the first write recorded after a time is in the last chunk whose first write was recorded at or before
it, or the next one: found by bisection. A page (the READ script) reads the chunks holding its own entries, never
a scan of entities.

A generation whose change log was written in the first format of this list (one JSON element per write, before
chunks) is refused by every read (ChangeLogIncompatible): `keel replay` rebuilds it.
"""
from __future__ import annotations

import re
import zlib
from binascii import a2b_base64, b2a_base64
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, cast

import msgspec

from ...decoding import json_value
from ...errors import StoreUnavailable, UsageError
from ...timeline import Assertion
from ...times import Micros
from ..base import ChangeEntry, ChangePage, EventWrites, Key, Store, Window
from .changelog_scripts import AROUND, READ, WINDOW
from .codec import ProvenanceCache, decode_point, encode_point
from .cold import cold_changes
from .keys import escape, prefix_of
from .retries import in_current

CHANGES = "ch"              # the change log's key, after the generation's data prefix
CHUNK_WRITES = 256          # writes per chunk at most (a page decodes one or two)
LEVEL = 1                   # zlib's level: its fastest
_digits = int.__repr__      # a time's digits, whatever int subclass carries it (keel.envelope.Instant prints RFC 3339)
_KEYS: dict[Any, str] = {}  # timeline key -> its JSON
_JSON = msgspec.json.Encoder()
_loads = msgspec.json.Decoder().decode
_CACHE = 100_000
_HEAD = re.compile(r"c(\d+)\|(\d+)\|(-?\d+)\|")
_OWNERLESS: dict[Any, str] = {}     # timeline key -> its JSON with owner "" (the write before in its run has it)
_REFS: dict[Key, tuple[str, str]] = {}     # key -> (escaped owner, P), for the AROUND script's arguments
_POINTS: dict[Any, str] = {}               # point -> point9 (codec.encode_point)


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


def _point9(point: Any) -> str:
    """codec.encode_point of a point, kept in the process-wide cache `_POINTS`."""
    if len(_POINTS) > _CACHE:
        _POINTS.clear()
    pt = _POINTS[point] = encode_point(point)
    return pt


def _chunk(body: list[Any], n: int, rec: Any) -> str:
    """`|<writes>|<recorded_at>|<body>`: the chunk less its position (the APPLY script prepends it)."""
    z = zlib.compress(_BODY(body), LEVEL, -15)
    return f"|{n}|{_digits(rec)}|{b2a_base64(z, newline=False).decode('ascii')}"


def encode_references(events: Sequence[EventWrites], base: int) -> list[str]:
    """The change-log chunks of one layout-1 step, `base` being the provenance list's length before it (the
    step's members are numbered as batch.encode_writes numbers them: an event's `b` is base plus the provenance
    entries of the events before it, `w` counts the step's writes from 1)."""
    out: list[str] = []
    keys, ownerless = _KEYS, _OWNERLESS
    body: list[Any] = []
    items: list[Any] = []
    first: Any = None
    n = w = 0
    b = base
    last_b = last_rec = 0       # of the chunk's run before (runs hold differences)
    for writes, _ in events:
        if not writes:
            continue
        provs: set[tuple[Any, ...]] = set()     # the event's provenance entries (batch.encode_writes's)
        ps = pe = pr = pb = None
        rec0: Any = None        # the run's recorded_at, point and owner of its write before
        point0: Any = None
        owner: Any = None
        for key, a in writes:
            point, _, _, source, evidence, rec, by, _ = a
            if not (source is ps and evidence is pe and rec == pr and by is pb):
                ps, pe, pr, pb = source, evidence, rec, by
                provs.add((source, evidence, rec, by))
            w += 1
            if n == CHUNK_WRITES:
                out.append(_chunk(body, n, first))
                body, n, rec0, last_b, last_rec = [], 0, None, 0, 0
            if rec0 is None or rec != rec0:
                if n == 0:
                    body.append(w)
                    first = rec
                items = []
                body.append((rec - last_rec, b - last_b, point, items))
                last_b, last_rec = b, rec
                rec0, point0, owner = rec, point, None
            kt = keys.get(key)
            if kt is None:
                kt = _key_json(key)
            if key[1] == owner:
                kt = ownerless[key]
            else:
                owner = key[1]
            items.append(kt if point == point0 else (kt, point))
            n += 1
        b += len(provs)
    if n:
        out.append(_chunk(body, n, first))
    return out


def encode_copies(events: Sequence[EventWrites]) -> list[str]:
    """The change-log chunks of one layout-2 step: runs of writes sharing their provenance, with their values."""
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


def positioned(chunks: list[str], start: int) -> tuple[list[str], int]:
    """Chunks as the APPLY scripts store them, numbered from `start` (a bulk load, the only writer of its
    generation, numbers its own); returns them and the position after them."""
    out = []
    for c in chunks:
        out.append(f"c{start}{c}")
        start += int(c[1:c.index("|", 1)])
    return out, start


# ---- reading ---------------------------------------------------------------------------------------------

class Ref(NamedTuple):
    """One write of a layout-1 chunk: its position, key, point, point9, recorded_at, its member's `b` and
    `<#b><b><#w><w>`."""
    position: int
    key: Key
    point: Micros
    point9: str
    recorded_at: Micros
    b: int
    bw: str


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


def references(elements: list[str], start: int, since: Micros | None, count: int) -> list[Ref]:
    """Up to `count` writes of layout-1 chunks, from position `start` on, recorded after `since` (None: any)."""
    out: list[Ref] = []
    points = _POINTS
    for element in elements:
        pos, n, body = runs_of(element)
        if pos + n <= start:
            continue
        w = body[0]
        b = rec = 0
        for dr, db, point0, items in body[1:]:
            rec += dr
            b += db
            k = len(items)
            if pos + k <= start or (since is not None and rec <= since):
                pos += k
                w += k
                continue
            bs = str(b)
            bb = f"{len(bs)}{bs}"
            owner = ""
            for item in items:
                point = point0
                if item[0].__class__ is list:
                    item, point = item
                if item[1]:
                    owner = item[1]
                    key = tuple(item)
                else:
                    key = (item[0], owner, *item[2:])
                if pos >= start:
                    pt = points.get(point)
                    if pt is None:
                        pt = _point9(point)
                    ws = str(w)
                    out.append(_new(Ref, (pos, key, point, pt, rec, b, f"{bb}{len(ws)}{ws}")))
                    if len(out) == count:
                        return out
                pos += 1
                w += 1
    return out


def copies(elements: list[str], start: int, since: Micros | None, count: int) -> list[ChangeEntry]:
    """Up to `count` writes of layout-2 chunks, from position `start` on, recorded after `since` (None: any)."""
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


def _owner_and_prefix(key: Key) -> tuple[str, str]:
    got = _REFS.get(key)
    if got is None:
        if len(_REFS) > _CACHE:
            _REFS.clear()
        got = _REFS[key] = (escape(key[1]), prefix_of(key))
    return got


def _body(rest: str, i: int, point: Micros) -> tuple[int, Any, bool, Micros | None]:
    """(k, value, closed, expires_at) of a member from its `<#k><k>` at rest[i] on (codec.decode_member's)."""
    lk = ord(rest[i]) - 48
    k = int(rest[i + 1:i + 1 + lk])
    i += 1 + lk
    expires = None
    if rest[i] == "~":
        j = rest.index(";", i)
        expires = point + int(rest[i + 1:j])
        i = j + 1
    head = rest[i]
    if head == "=":
        return k, json_value(rest[i + 1:]), False, expires
    if head == "-":
        return k, None, True, expires
    return k, json_value(rest[i + 1:]), True, expires


Build = Callable[[str], tuple[list[str], list[Any]]]


class ChangeLogReads:
    """`Store.changes`, `Store.change_page` and `Store.windows_many` for both Redis layouts (a mixin of
    RedisStore: its script runner and generations)."""

    _changes_script: Any = None
    _around_script: Any = None
    _window_script: Any = None
    layout: int
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
        """One READ call for the chunks; in layout 1 one AROUND call then reads each entry's member and (with
        `window`) the window of each entry `keep` accepts, from the same generation (both again when a replay
        switched the tenant in between)."""
        if self._changes_script is None:
            self._changes_script = self.client.register_script(READ)
        return in_current(tenant, lambda: self._page(tenant, start, since, generation, count, window, keep))

    def _page(self, tenant: str, start: int | None, since: Micros | None, generation: int | None, count: int,
              window: int, keep: Callable[[Key], bool] | None) -> ChangePage | None:
        read: dict[str, int] = {}

        def build(d: str) -> tuple[list[str], list[Any]]:
            gen = read["gen"] = int(d.rstrip(":").rpartition(":g")[2])
            read["from_start"] = start is not None and generation == gen
            return ([d + CHANGES, d + "m"],
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
            if self.layout != 1:
                if code == 7:                   # the page starts below what Redis holds: the cold tier's first
                    moved = cold_changes(cast(Any, self), tenant, gen, first, count,
                                         at if from_start else (0 if after is None else None), after)
                    if moved is None:
                        return None             # a cut-over dropped them meanwhile: read the new generation
                    elements = [*moved, *elements]
                    if not from_start:
                        at = runs_of(moved[0])[0]
                entries = copies(elements, at, after, count)
                if after is not None:
                    at = entries[0].position if entries else length
                return ChangePage(gen, at, entries, length, known)
            refs = references(elements, at, after, count)
        except (ValueError, zlib.error, msgspec.DecodeError) as e:
            raise ChangeLogIncompatible(tenant, gen) from e
        if after is not None:
            at = refs[0].position if refs else length
        if not refs:
            return ChangePage(gen, at, [], length, known, {} if window else None)
        return self._resolve(tenant, gen, at, cast(list[Ref], refs), length, known, window, keep)

    def _resolve(self, tenant: str, gen: int, at: int, refs: list[Ref], length: int, known: Micros | None,
                 window: int, keep: Callable[[Key], bool] | None) -> ChangePage | None:
        """The entries of layout-1 references, and their windows: one AROUND call on generation `gen`."""
        if self._around_script is None:
            self._around_script = self.client.register_script(AROUND)
        names = self._n(tenant)
        d = names.data(gen)
        wants = [bool(window) and (keep is None or keep(r.key)) for r in refs]
        args: list[Any] = [str(window), d + "z:"]
        for r, want in zip(refs, wants):
            owner, p = _owner_and_prefix(r.key)
            args += (owner, p, r.point9, r.bw, "1" if want else "")
        expected = "" if self._gen_guess(tenant)[1] == "" else str(gen)
        result = self._around_script(keys=[names.gen, d + "pv"], args=[expected, *args])
        code = int(result[0])
        if code == 0:
            self._gens[tenant] = int(result[1])
            return None
        if code == 6:
            raise StoreUnavailable(f"the change log of tenant {tenant!r} names a write its graph does not hold "
                                   f"(a generation dropped while read?)", tenant=tenant)
        prov = ProvenanceCache()
        pairs = result[2]
        for i in range(0, len(pairs), 2):
            prov.add(pairs[i], pairs[i + 1])
        provs = prov.entries
        out = result[1]
        entries: list[ChangeEntry] = []
        windows: dict[int, Window] = {}
        j = 0
        assertion = prov.assertion
        for r, want in zip(refs, wants):
            point = r.point
            k, value, closed, expires = _body(out[j], 0, point)
            source, evidence, rec, by = provs[r.b + k]
            a = _new(Assertion, (point, value, closed, source, evidence, rec, by, expires))
            entries.append(_new(ChangeEntry, (r.position, r.key, a)))
            if want:
                last, below, more, nx = out[j + 1:j + 5]
                got = [assertion(m) for m in below] if below else []
                if last:
                    lb = ord(last[0]) - 48
                    lk, value, closed, expires = _body(last, 2 + lb + ord(last[1 + lb]) - 48, point)
                    source, evidence, rec, by = provs[int(last[1:1 + lb]) + lk]
                    got.append(_new(Assertion, (point, value, closed, source, evidence, rec, by, expires)))
                got.append(a)
                windows[r.position] = _new(Window, (got, (got[0].point if below else point) if more == "1" else None,
                                                    decode_point(nx) if nx else None, False))
                j += 5
            else:
                j += 1
        return ChangePage(gen, at, entries, length, known, windows if window else None)

    def windows_many(self, tenant: str, items: list[tuple[Key, Micros]], size: int) -> list[Window]:
        """Layout 1 reads, for each (key, point), the members at the point, the last `size` of the point before
        it, and the next point (the WINDOW script); layout 2, whose timelines live in segments, reads whole
        timelines (Store's default). (keel/changes.py asks `change_page` for its windows: they name the change's
        own member, so layout 1 reads less there.)"""
        if self.layout != 1 or not items:
            return Store.windows_many(cast(Store, self), tenant, items, size)
        if self._window_script is None:
            self._window_script = self.client.register_script(WINDOW)
        unique = list(dict.fromkeys(items))
        triples = [x for key, point in unique for x in (escape(key[1]), prefix_of(key), encode_point(point))]
        [result] = self._script_many(self._window_script,
                                     [(tenant, lambda d: ([d + "pv"], [str(size), d + "z:", *triples]))])
        prov = ProvenanceCache()
        pairs = result[2]
        for i in range(0, len(pairs), 2):
            prov.add(pairs[i], pairs[i + 1])
        found: dict[tuple[Key, Micros], Window] = {}
        lists = result[1]
        for i, item in enumerate(unique):
            below, at, more, nx = lists[4 * i:4 * i + 4]
            assertions = [prov.assertion(m) for m in [*below, *at]]
            found[item] = Window(assertions, assertions[0].point if more == "1" else None,
                                 decode_point(nx) if nx else None, False)
        return [found[item] for item in items]
