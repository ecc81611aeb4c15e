"""The Redis store: the Store contract on a single redis-server or on Redis Cluster.

Key layout. Every key of a tenant carries the hash tag `{<namespace>/<tenant>}`, so a tenant lives in
one hash slot and its scripts and MULTI/EXEC blocks are legal on Cluster:

    keel:{<ns>}:tenants                    set: tenants ever written in the namespace (a registry)
    keel:{<ns>/<t>}:gen                    string: the current generation (absent = 1)
    keel:{<ns>/<t>}:gseq                   string: the highest generation handed out
    keel:{<ns>/<t>}:g<N>:ev                set: applied event ids
    keel:{<ns>/<t>}:g<N>:m                 hash: `sv` (write counter, the search version), applied offsets
    keel:{<ns>/<t>}:g<N>:ents              set: the generation's entities (its explicit index)
    keel:{<ns>/<t>}:g<N>:pv                list: provenance entries `[source, evidence, recorded_at, by]`
    keel:{<ns>/<t>}:g<N>:z:<entity>        sorted set: every assertion of the timelines the entity owns
    keel:{<ns>/<t>}:g<N>:x:<entity>        list: [first recorded_at, one element per timeline involving it]

A timeline is owned by the entity in its key's second place (the subject of a relation). All members
of an entity's sorted set have score 0 and sort by bytes:

    <P><point><#b><b><#w><w><#k><k><body>

* P, the timeline prefix: the key's kind, then each key part after the owner, each followed by `|`
  (`f|balance|` + scope + `|`, `l|ref|`, `r|owed_by|household:h1|`, `e|`); parts are escaped
  (`%` → `%25`, `|` → `%7C`), so prefixes are prefix-free and `[P` .. `(P~` is exactly one timeline.
* point: valid time in micros + 2**53, as 9 base-64 characters of an alphabet in ASCII order.
* b: the provenance list length when the event was applied, w: the write's index in its batch; at one
  point they order assertions by log order. k: the write's provenance entry is at index b + k.
* body: `=<json value>`, `-` (an end), `!<json value>` (an end carrying a value), optionally preceded
  by `~<expires_at - point>;`.
`#x` is the length of x as one digit. Assertions are decoded with keel.timeline rules on the way out.

An index list element is P for a timeline the entity owns, `>` + owner + `|` + P for a relation
naming it as object. Namespace and tenant match the tenant pattern (no braces), so the hash tag is
always ours; entity names are escaped like key parts, so no user string can forge a key.

Reads go through the current generation: each script or MULTI block re-reads `gen` and the client
retries when a switch happened since it computed its key names. `view` (what `context` reads) is one VIEW
script per entity, and `views` sends several in one pipeline. VIEW is the one script that reads keys it was
not given: the sorted sets of the subjects of relations naming the entity as object, named from its index
list; they carry the tenant's hash tag, so they are in the script's hash slot. `for_generation` gives a view pinned
to one generation of one tenant (to rebuild it while the current one keeps serving).
"""
from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import hiredis
import redis
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError, RedisError, ResponseError

try:
    from hiredis import pack_command as _pack_command
except ImportError:        # pragma: no cover - hiredis is a dependency; redis-py's pipeline is the fallback
    _pack_command = None

from ..envelope import TENANT
from ..errors import StoreUnavailable, UsageError
from ..timeline import Assertion, Timeline, Version, covering
from ..times import Micros
from . import redis_scripts
from .base import GLOBAL_TENANT, REF_LABEL, EntityView, Freshness, Key, Store, ViewRequest, Write, entity_view

Client = redis.Redis | RedisCluster
Event = tuple[list[Write], str | None]
Position = tuple[str, int, int] | tuple[str, int, int, int | None]   # (topic, partition, last offset applied[, log end])
Step = tuple[str, Sequence[Event], Position | None]
Build = Callable[[str], tuple[list[str], list[Any]]]   # data prefix -> (script keys after `gen`, args after the check)

_OFFSET = 2 ** 53                 # points are kept as point + 2**53 in 54 bits (exact as doubles too)
_ALPHABET = "-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"   # ASCII order
_DIGIT = {c: i for i, c in enumerate(_ALPHABET)}
_CHUNK = 500                      # timelines or entities per round trip when walking a whole tenant
_RETRIES = 8                      # generation switches tolerated during one call
_SEND_GROUP = 32                  # pipelined APPLY calls sent together while the next ones are encoded
_ESCAPED = re.compile(r"%(25|7C)")
_JSON = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)
_STR = json.encoder.encode_basestring     # JSON string literal, non-ASCII kept (like ensure_ascii=False)
_ARITY = {"e": 0, "l": 1, "f": 2, "r": 2}


# ---- encodings -------------------------------------------------------------------------------

class GenerationChanged(StoreUnavailable):
    """A strict writer's batch met a new current generation (a replay cut over): drop what was computed
    from the old one and plan again from the new generation."""

    def __init__(self, tenant: str, old: int, new: int) -> None:
        super().__init__(f"tenant {tenant!r} moved from generation {old} to {new} (a replay cut over); "
                         f"the batch must be planned again", tenant=tenant)
        self.old = old
        self.new = new


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("|", "%7C") if ("%" in part or "|" in part) else part


def _unescape(part: str) -> str:
    return _ESCAPED.sub(lambda m: "%" if m.group(1) == "25" else "|", part) if "%" in part else part


def prefix_of(key: Key) -> str:
    """The timeline prefix P of a key inside its owner's sorted set."""
    kind = key[0]
    if kind == "f" and len(key) == 4:
        return f"f|{_escape(key[2])}|{_escape(key[3])}|"
    if kind == "l" and len(key) == 3:
        return f"l|{_escape(key[2])}|"
    if kind == "r" and len(key) == 4:
        return f"r|{_escape(key[2])}|{_escape(key[3])}|"
    if kind == "e" and len(key) == 2:
        return "e|"
    raise UsageError(f"bad timeline key {key!r}")


def key_of(owner: str, text: str) -> tuple[Key, int]:
    """(key, length of P) from an owner and a string starting with P."""
    kind = text[0]
    parts: list[str] = [kind, owner]
    i = 2
    for _ in range(_ARITY[kind]):
        j = text.index("|", i)
        parts.append(_unescape(text[i:j]))
        i = j + 1
    return tuple(parts), i


def encode_point(point: int) -> str:
    v = int(point) + _OFFSET
    if not 0 < v < 2 * _OFFSET:
        raise UsageError(f"time {point} (micros) is outside the range the Redis store keeps (±2**53)")
    out = []
    for _ in range(9):
        v, r = divmod(v, 64)
        out.append(_ALPHABET[r])
    return "".join(reversed(out))


def decode_point(text: str) -> Micros:
    v = 0
    for c in text:
        v = v * 64 + _DIGIT[c]
    return v - _OFFSET


def _clamped_point(t: int) -> str:
    return encode_point(min(max(int(t), 1 - _OFFSET), _OFFSET - 1))


def _json(value: Any) -> str:
    """Compact JSON of a value, with fast paths for the scalars most writes carry."""
    t = type(value)
    if t is str:
        return _STR(value)
    if t is int:
        return int.__repr__(value)
    if value is None:
        return "null"
    if t is bool:
        return "true" if value else "false"
    if t is float and math.isfinite(value):
        return float.__repr__(value)
    return _JSON.encode(value)


def encode_body(a: Assertion) -> str:
    if not a.closed:
        body = "=" + _json(a.value)
    elif a.value is None:
        body = "-"
    else:
        body = "!" + _json(a.value)
    if a.expires_at is not None:
        body = f"~{int(a.expires_at) - int(a.point)};{body}"
    return body


def encode_provenance(source: Any, evidence: Any, recorded_at: int, by: Any) -> str:
    """`[source, evidence, recorded_at]` or `[source, evidence, recorded_at, by]`."""
    if by is None:
        return f"[{_json(source)},{_json(evidence)},{recorded_at}]"
    return f"[{_json(source)},{_json(evidence)},{recorded_at},{_json(by)}]"


def decode_member(rest: str, point: Micros | None = None) -> tuple[Micros, int, Any, bool, Micros | None]:
    """(point, provenance index, value, closed, expires_at) from a member with P removed."""
    if point is None:
        point = decode_point(rest[:9])
    i = 9
    lb = ord(rest[i]) - 48
    b = int(rest[i + 1:i + 1 + lb])
    i += 1 + lb
    i += 1 + ord(rest[i]) - 48
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
        return point, b + k, json.loads(rest[i + 1:]), False, expires
    if head == "-":
        return point, b + k, None, True, expires
    return point, b + k, json.loads(rest[i + 1:]), True, expires


def _provenance(text: str) -> tuple[Any, Any, Micros, Any]:
    """(source, evidence, recorded_at, by) of a provenance entry."""
    p = json.loads(text)
    return p[0], p[1], int(p[2]), p[3] if len(p) > 3 else None


class _Provenance:
    """Decoded provenance entries, by index; `fetch` reads one that is missing (written since loading)."""
    __slots__ = ("entries", "fetch")

    def __init__(self, fetch: Callable[[int], str | None] | None = None) -> None:
        self.entries: dict[int, tuple[Any, Any, Micros, Any]] = {}
        self.fetch = fetch

    def add(self, index: int, text: str | None) -> None:
        if text is None:
            raise StoreUnavailable(f"provenance entry {index} is missing (a generation dropped while read?)")
        self.entries[int(index)] = _provenance(text)

    def assertion(self, rest: str) -> Assertion:
        point, n, value, closed, expires = decode_member(rest)
        if n not in self.entries and self.fetch is not None:
            self.add(n, self.fetch(n))
        source, evidence, recorded_at, by = self.entries[n]
        return Assertion(point, value, closed, source, evidence, recorded_at, by, expires)


def _check_name(what: str, name: str, allow_global: bool = False) -> str:
    if not isinstance(name, str) or not (TENANT.match(name) or (allow_global and name == GLOBAL_TENANT)):
        raise UsageError(f"bad {what} {name!r}: use [A-Za-z0-9][A-Za-z0-9._-]{{0,63}}")
    return name


class _Names:
    """Key names of one tenant."""
    __slots__ = ("base", "gen", "gseq")

    def __init__(self, namespace: str, tenant: str) -> None:
        self.base = f"keel:{{{namespace}/{tenant}}}:"
        self.gen = self.base + "gen"
        self.gseq = self.base + "gseq"

    def data(self, gen: int) -> str:
        return f"{self.base}g{gen}:"


def _offset_field(topic: str, partition: int) -> str:
    return "o" + _JSON.encode([topic, int(partition)])


def _chunks(items: list[Any], size: int = _CHUNK) -> Iterator[list[Any]]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


class _Pending:
    """One tenant's apply step between tries: its events (repeated ids dropped), offset, the latest
    recorded_at of its writes and the partition's lag after it (the position's log end, when given)."""
    __slots__ = ("batch", "events", "field", "lag", "latest", "offset", "tenant")

    def __init__(self, tenant: str, events: Sequence[Event], position: Position | None) -> None:
        self.tenant = tenant
        seen: set[str] = set()
        self.events: list[Event] = []
        for writes, event_id in events:
            if event_id:
                if event_id in seen:
                    continue
                seen.add(event_id)
            self.events.append((writes, event_id))
        self.field, self.offset = ("", "0") if position is None else \
            (_offset_field(position[0], position[1]), str(int(position[2])))
        self.lag = "" if position is None or len(position) < 4 or position[3] is None else \
            str(max(0, int(position[3]) - int(position[2]) - 1))
        self.latest = str(max((a[5] for writes, _ in self.events for _, a in writes), default=""))
        self.batch: _Batch | None = None


class _Batch:
    """One apply step encoded as the APPLY script's keys and arguments, for a guessed provenance length.

    Members are complete strings (`_encode`): the provenance base `b` of each event is `base` plus the
    entries of the events before it. When the server answers that the guess was wrong, the batch is
    encoded again.
    """
    __slots__ = ("args", "entities", "events")

    def __init__(self, events: list[Event], base: int, field: str, offset: str, latest: str = "",
                 lag: str = "") -> None:
        self.events = events
        tls, provs = _encode(events, base)
        ents, min_recorded = _entities(tls)
        self.entities = list(ents)
        ids = [event_id for _, event_id in events if event_id]
        args: list[Any] = [str(base), field, offset, len(ids), *ids, len(ents)]
        for name, rec in zip(ents, min_recorded):
            args += (name, rec)
        args.append(len(tls))
        for members, _, header, p in tls.values():
            args.append(f"{header}{len(members)},{p}")
            args += members
        args.append(len(provs))
        args += provs
        args += (latest, lag)
        self.args = args

    def keys(self, d: str) -> list[str]:
        keys = [d + "ev", d + "m", d + "ents", d + "pv"]
        for e in self.entities:
            e = _escape(e)
            keys += (d + "z:" + e, d + "x:" + e)
        return keys


def _encode(events: Sequence[Event], base: int) -> tuple[dict[Key, list[Any]], list[str]]:
    """The members and provenance entries of one step, `base` being the provenance list's length before it:
    ({key: [members, min recorded_at, header (set by `_entities`), P]} in order of first write, entries).

    Encoding is the worker's hot path: one loop over the writes, with process-wide caches of prefixes and
    points, and a shortcut for writes sharing their event's single provenance entry.
    """
    tls: dict[Key, list[Any]] = {}      # key -> [members, min recorded_at, header, P]
    provs: list[str] = []
    points = _POINTS
    if len(points) > _CACHE:
        points.clear()
    wtext = _W
    n = sum(len(writes) for writes, _ in events)
    if len(wtext) <= n:
        _grow_w(n)
    w = 0
    for writes, _ in events:
        text = str(base + len(provs))
        bb = f"{len(text)}{text}"
        seen: dict[tuple[Any, ...], str] = {}
        ps = pe = pr = pb = pks = None      # the last provenance met: most events have a single one
        for key, a in writes:
            point, value, closed, source, evidence, rec, by, expires = a
            if source is ps and evidence is pe and rec == pr and by is pb:
                ks = pks
                rec = pr
            else:
                rec = int(rec)
                prov = (source, evidence, rec, by)
                ks = seen.get(prov)
                if ks is None:
                    n = len(seen)
                    ks = seen[prov] = f"1{n}" if n < 10 else f"{len(str(n))}{n}"
                    provs.append(encode_provenance(source, evidence, rec, by))
                ps, pe, pr, pb, pks = source, evidence, rec, by, ks
            pt = points.get(point)
            if pt is None:
                pt = points[point] = encode_point(point)
            if closed or expires is not None:
                body = encode_body(a)
            else:
                tv = value.__class__
                if tv is str:
                    body = "=" + _STR(value)
                elif tv is int:
                    body = "=" + int.__repr__(value)
                elif value is True:
                    body = "=true"
                else:
                    body = "=" + _json(value)
            w += 1
            t = tls.get(key)
            if t is None:
                p = _PREFIXES.get(key)
                if p is None:
                    p = _prefix(key)
                tls[key] = [[f"{p}{pt}{bb}{wtext[w]}{ks}{body}"], rec, "", p]
            else:
                t[0].append(f"{t[3]}{pt}{bb}{wtext[w]}{ks}{body}")
                if rec < t[1]:   # noqa: PLR1730 - the common case is a comparison only
                    t[1] = rec
    return tls, provs


def _entities(tls: dict[Key, list[Any]], headers: bool = True) -> tuple[dict[str, int], list[int]]:
    """The entities of a step's timelines, owners and relation objects, in order of first appearance, with
    the minimum recorded_at of the writes involving each; with `headers`, sets each timeline's APPLY header
    `<owner index>,<object index or 0>,` (1-based)."""
    ents: dict[str, int] = {}
    min_recorded: list[int] = []
    for key, t in tls.items():     # entity indexes in order of first appearance, as the script wants
        owner, rec = key[1], t[1]
        o = ents.get(owner)
        if o is None:
            o = ents[owner] = len(ents)
            min_recorded.append(rec)
        elif rec < min_recorded[o]:
            min_recorded[o] = rec
        if key[0] == "r" and key[3] != owner:
            x = ents.get(key[3])
            if x is None:
                x = ents[key[3]] = len(ents)
                min_recorded.append(rec)
            elif rec < min_recorded[x]:
                min_recorded[x] = rec
            if headers:
                t[2] = f"{o + 1},{x + 1},"
        elif headers:
            t[2] = f"{o + 1},0,"
    return ents, min_recorded


class _LoadStep:
    """One step of a GenerationLoader, encoded as plain commands."""
    __slots__ = ("bump", "commands")

    def __init__(self, commands: list[tuple[str, ...]], bump: int) -> None:
        self.commands = commands
        self.bump = bump              # 1 when the step moves the write counter `sv` (as APPLY would)


def _push(commands: list[tuple[str, ...]], name: str, key: str, items: list[str]) -> None:
    """`name key items...` in commands of at most _LOAD_ITEMS items."""
    if len(items) <= _LOAD_ITEMS:
        if items:
            commands.append((name, key, *items))
        return
    for i in range(0, len(items), _LOAD_ITEMS):
        commands.append((name, key, *items[i:i + _LOAD_ITEMS]))


def _zadd(commands: list[tuple[str, ...]], key: str, members: list[str]) -> None:
    """ZADD of members with score 0, at most _LOAD_ITEMS members a command."""
    for i in range(0, len(members), _LOAD_ITEMS):
        chunk = members[i:i + _LOAD_ITEMS] if len(members) > _LOAD_ITEMS else members
        pairs = ["0"] * (2 * len(chunk))
        pairs[1::2] = chunk
        commands.append(("ZADD", key, *pairs))


class GenerationLoader:
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

    def __init__(self, store: RedisStore, tenant: str, gen: int) -> None:
        self.store = store
        self.tenant = tenant
        self.gen = int(gen)
        self.d = store._n(tenant).data(self.gen)
        self.base = 0                          # provenance entries, once the queued steps are written
        self.sv = 0                            # the write counter as the server has it
        self.first: dict[str, int] = {}        # entity -> element 0 of its index list (min recorded_at)
        self.known: set[Key] = set()           # timelines with members
        self.ids: set[str] = set()             # applied event ids
        self.offsets: dict[str, int] = {}      # offset field -> offset
        self.known_through = -1                # the meta hash's `kt` as the queued steps leave it
        self.queue: list[_LoadStep] = []       # steps not known to be written, in order
        self.sent = 0                          # of them, sent on `conn` and not answered yet
        self.unsure = False                    # a failure left the queued steps' fate unknown
        self.conn: Any = None
        self.conn_id: str | None = None        # its CLIENT ID, while steps sent on it may be unanswered
        self.pool: Any = None
        d = self.d
        with store._guard("load_generation", tenant):
            if self.gen == int(store._client.get(store._n(tenant).gen) or 1):
                raise UsageError(f"generation {gen} is the current generation of tenant {tenant!r}: a bulk "
                                 f"load writes only a generation nobody reads")
            if int(store._client.exists(d + "ev", d + "m", d + "ents", d + "pv")):
                raise UsageError(f"generation {gen} of tenant {tenant!r} holds data: a bulk load starts from "
                                 f"an empty generation")
            store._register(tenant)

    @property
    def pending(self) -> int:
        """Steps not known to be written yet."""
        return len(self.queue)

    def add(self, events: Sequence[Event], position: Position | None) -> None:
        """Queue one step, as `commit_batch(tenant, events, position)`: events whose id was applied before
        (or earlier in the step) are skipped whole, and the offset only moves forward."""
        p = _Pending(self.tenant, events, position)
        ids = self.ids
        kept = [e for e in p.events if not e[1] or e[1] not in ids]
        new_ids = [event_id for _, event_id in kept if event_id]
        ids.update(new_ids)
        d = self.d
        commands: list[tuple[str, ...]] = []
        tls: dict[Key, list[Any]] = {}
        if kept:
            tls, provs = _encode(kept, self.base)
            ents, min_recorded = _entities(tls, headers=False)
            first, known = self.first, self.known
            _push(commands, "SADD", d + "ents", [e for e in ents if e not in first])   # before the keys it indexes
            members: dict[str, list[str]] = {}
            push: dict[str, list[str]] = {}
            for key, t in tls.items():
                owner = key[1]
                z = members.get(owner)
                if z is None:
                    members[owner] = t[0]
                else:
                    z += t[0]
                if key not in known:
                    known.add(key)
                    prefix = t[3]
                    q = push.get(owner)
                    if q is None:
                        push[owner] = [prefix]
                    else:
                        q.append(prefix)
                    if key[0] == "r" and key[3] != owner:
                        push.setdefault(key[3], []).append(f">{_escape(owner)}|{prefix}")
            for e, rec in zip(ents, min_recorded):
                name = e if ("%" not in e and "|" not in e) else _escape(e)
                z = members.get(e)
                if z is not None:
                    _zadd(commands, f"{d}z:{name}", z)
                elements = push.get(e)
                f = first.get(e)
                if f is None:
                    first[e] = rec
                    elements = [str(rec)] if elements is None else [str(rec), *elements]
                elif rec < f:
                    first[e] = rec
                    commands.append(("LSET", f"{d}x:{name}", "0", str(rec)))
                if elements is not None:
                    _push(commands, "RPUSH", f"{d}x:{name}", elements)
            _push(commands, "RPUSH", d + "pv", provs)
            self.base += len(provs)
            _push(commands, "SADD", d + "ev", new_ids)
        bump = 1 if new_ids or tls else 0
        if bump:
            commands.append(("HINCRBY", d + "m", "sv", "1"))
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
        with self.store._guard("load_generation", self.tenant):
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
        self.store._pv_len.pop(self.d, None)

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
        client = self.store._client
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
        with self.store._guard("load_generation", self.tenant):
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


_CACHE = 100_000                  # entries of the process-wide encoding caches before they are cleared
_LOAD_ITEMS = 1000                # members or elements per command of a bulk load
_MULTI, _EXEC = hiredis.pack_command(("MULTI",)), hiredis.pack_command(("EXEC",))
_POINTS: dict[Any, str] = {}      # point -> its 9 characters
_PREFIXES: dict[Key, str] = {}   # key -> P
_W: list[str] = ["10"]            # w -> `<#w><w>`


def _grow_w(n: int) -> None:
    while len(_W) <= n:
        ws = str(len(_W))
        _W.append(f"{len(ws)}{ws}")


def _prefix(key: Key) -> str:
    if len(_PREFIXES) > _CACHE:
        _PREFIXES.clear()
    p = _PREFIXES[key] = prefix_of(key)
    return p


# ---- the store -------------------------------------------------------------------------------

class RedisStore(Store):
    """A Store over Redis (single node or Cluster); one namespace (a cartridge) per instance."""

    def __init__(self, client: Client, *, namespace: str, pins: dict[str, int] | None = None,
                 owns_client: bool = True, strict_generations: bool = False) -> None:
        self._client = client
        self.strict_generations = strict_generations   # writers raise GenerationChanged instead of following
        self.namespace = _check_name("namespace", namespace)
        self._registry = f"keel:{{{namespace}}}:tenants"
        self._pins: dict[str, int] = dict(pins or {})
        self._gens: dict[str, int] = {}
        self._names: dict[str, _Names] = {}
        self._registered: set[str] = set()
        self._pv_len: dict[str, int] = {}     # data prefix -> provenance list length after our last write
        self._owns_client = owns_client
        self._apply = client.register_script(redis_scripts.APPLY)
        self._as_of = client.register_script(redis_scripts.AS_OF)
        self._read = client.register_script(redis_scripts.READ)
        self._view = client.register_script(redis_scripts.VIEW)
        self._switch = client.register_script(redis_scripts.SWITCH)
        self._new_gen = client.register_script(redis_scripts.NEW_GENERATION)
        self._switch_if = client.register_script(redis_scripts.SWITCH_IF_CAUGHT_UP)

    @classmethod
    def from_url(cls, url: str, *, namespace: str, cluster: bool | None = None,
                 strict_generations: bool = False, **options: Any) -> RedisStore:
        """Connect to `redis://…`; `cluster=None` asks the server (`INFO cluster`) whether it is a Cluster node."""
        options.setdefault("socket_connect_timeout", 5)
        options.setdefault("socket_timeout", 30)
        try:
            if cluster is None:
                probe = redis.Redis.from_url(url, **options)
                try:
                    cluster = bool(probe.info("cluster").get("cluster_enabled"))
                finally:
                    probe.close()
            client: Client
            if cluster:
                client = RedisCluster.from_url(url, decode_responses=True, **options)
            else:
                client = redis.Redis.from_url(url, decode_responses=True, **options)
        except RedisError as e:
            raise StoreUnavailable(f"cannot connect to Redis at {url}: {type(e).__name__}: {e}") from e
        return cls(client, namespace=namespace, strict_generations=strict_generations)

    @property
    def client(self) -> Client:
        return self._client

    def close(self) -> None:
        if self._owns_client:
            self._client.close()

    # ---- plumbing ------------------------------------------------------------------------------

    @contextmanager
    def _guard(self, what: str, tenant: str | None = None) -> Iterator[None]:
        """Translate redis errors into StoreUnavailable at the boundary."""
        try:
            yield
        except RedisError as e:
            where = f"namespace {self.namespace!r}" + (f", tenant {tenant!r}" if tenant else "")
            raise StoreUnavailable(f"Redis {what} failed ({where}): {type(e).__name__}: {e}", tenant=tenant) from e

    def _n(self, tenant: str) -> _Names:
        names = self._names.get(tenant)
        if names is None:
            names = self._names[tenant] = _Names(self.namespace, _check_name("tenant", tenant, allow_global=True))
        return names

    def _gen_guess(self, tenant: str) -> tuple[int, str]:
        """(generation to compute keys for, generation to check: "" when pinned)."""
        pinned = self._pins.get(tenant)
        if pinned is not None:
            return pinned, ""
        gen = self._gens.get(tenant, 1)
        return gen, str(gen)

    def _script(self, tenant: str, script: Any, build: Build) -> list[Any]:
        """Run a generation-checked script; `build(data prefix)` gives (keys after `gen`, args after the check)."""
        return self._script_many(script, [(tenant, build)])[0]

    def _script_many(self, script: Any, calls: Sequence[tuple[str, Build]]) -> list[list[Any]]:
        """Generation-checked script calls, each `(tenant, build)` as in `_script`, in one round trip;
        the calls whose tenant switched generation meanwhile are built again and rerun."""
        out: list[list[Any]] = [[] for _ in calls]
        todo = list(range(len(calls)))
        for _ in range(_RETRIES):
            sent = []
            for i in todo:
                names = self._n(calls[i][0])
                gen, expected = self._gen_guess(calls[i][0])
                keys, args = calls[i][1](names.data(gen))
                sent.append(([names.gen, *keys], [expected, *args]))
            left = []
            for i, result in zip(todo, self._eval_many(script, sent)):
                if result[0] == 0:
                    self._gens[calls[i][0]] = int(result[1])
                    left.append(i)
                else:
                    out[i] = result
            if not left:
                return out
            todo = left
        tenant = calls[todo[0]][0]
        raise StoreUnavailable(f"the generation of tenant {tenant!r} kept changing", tenant=tenant)

    def _eval_many(self, script: Any, calls: Iterable[tuple[list[str], list[Any]]]) -> list[Any]:
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
        results = self._pipelined(commands(calls))
        for _ in range(2):
            missing = []
            for i, result in enumerate(results):
                if isinstance(result, NoScriptError):
                    missing.append(i)
                elif isinstance(result, Exception):
                    raise result
            if not missing:
                return results
            self._client.script_load(script.script)
            retried = [seen[i] for i in missing]
            for i, result in zip(missing, self._pipelined(commands(retried))):
                results[i] = result
        raise StoreUnavailable("a script kept missing on the Redis server (SCRIPT FLUSH in a loop?)")

    def _tx(self, tenant: str, fill: Callable[[Any, str], None]) -> list[Any]:
        """Run reads in one MULTI/EXEC that also checks the generation; `fill(pipe, data prefix)`."""
        names = self._n(tenant)
        for _ in range(_RETRIES):
            gen, expected = self._gen_guess(tenant)
            pipe = self._client.pipeline(transaction=True)
            if expected:
                pipe.get(names.gen)
            fill(pipe, names.data(gen))
            result = pipe.execute()
            if not expected:
                return result
            current = result[0] or "1"
            if current == expected:
                return result[1:]
            self._gens[tenant] = int(current)
        raise StoreUnavailable(f"the generation of tenant {tenant!r} kept changing", tenant=tenant)

    def _register(self, tenant: str) -> None:
        if tenant not in self._registered:
            self._client.sadd(self._registry, tenant)
            self._registered.add(tenant)

    # ---- writes --------------------------------------------------------------------------------

    def apply_writes(self, tenant: str, writes: list[Write], event_id: str | None = None) -> None:
        """Apply writes and mark event_id in one script. An event id already applied is skipped whole."""
        if not writes and event_id is None:
            return
        self._commit([(tenant, [(writes, event_id)], None)], "apply_writes")

    def commit_batch(self, tenant: str, events: Sequence[tuple[list[Write], str]],
                     position: Position | None) -> None:
        """Apply several events, mark their ids and store the applied offset, in one atomic step.

        `position` is (topic, partition, offset of the last record of the batch). Events whose id was
        already applied (before, or earlier in this batch) are skipped whole, so re-committing a batch
        changes nothing. The stored offset only moves forward.
        """
        self._commit([(tenant, events, position)], "commit_batch")

    def commit_many(self, steps: Sequence[Step]) -> None:
        """Several `commit_batch` steps (e.g. the tenants of one poll) in one round trip.

        Each step is atomic and idempotent on its own; steps of different tenants are not atomic together.
        """
        self._commit(steps, "commit_many")

    def _commit(self, steps: Sequence[Step], what: str) -> None:
        pending = [_Pending(tenant, events, position) for tenant, events, position in steps
                   if events or position is not None]
        if not pending:
            return
        with self._guard(what, pending[0].tenant if len(pending) == 1 else None):
            unregistered = sorted({p.tenant for p in pending} - self._registered)
            for tenant in unregistered:
                self._n(tenant)
            if unregistered:
                self._client.sadd(self._registry, *unregistered)
                self._registered.update(unregistered)
            self._load_pv_lengths(pending)
            for _ in range(_RETRIES):
                tries: list[str] = []
                calls = self._attempts(pending, tries)
                results = self._eval_many(self._apply, list(calls) if len(pending) == 1 else calls)
                pending = [p for p, d, result in zip(pending, tries, results) if not self._settle(p, d, result)]
                if not pending:
                    return
        raise StoreUnavailable(f"could not apply a batch of tenant {pending[0].tenant!r}: it kept conflicting "
                               f"with other writers", tenant=pending[0].tenant)

    def _attempts(self, pending: list[_Pending], tries: list[str]) -> Iterator[tuple[list[str], list[Any]]]:
        """The APPLY (keys, args) of each step, encoded as they are sent (the server runs the steps sent
        before meanwhile); the data prefix each was planned on goes to `tries`."""
        for p in pending:
            keys, args, d = self._attempt(p)
            tries.append(d)
            yield keys, args

    def _load_pv_lengths(self, pending: list[_Pending]) -> None:
        """The provenance list lengths this client does not know yet, in one round trip (the APPLY
        script checks them anyway: a wrong one costs a retry of that step)."""
        missing = []
        for p in pending:
            d = self._n(p.tenant).data(self._gen_guess(p.tenant)[0])
            if d not in self._pv_len:
                missing.append(d)
        if len(missing) < 2:
            return          # _attempt reads a single one
        pipe = self._client.pipeline(transaction=False)
        for d in missing:
            pipe.llen(d + "pv")
        for d, n in zip(missing, pipe.execute()):
            self._pv_len[d] = int(n)

    def _pipelined(self, calls: Iterable[tuple[Any, ...]]) -> list[Any]:
        """Run commands in one round trip; an error answer is returned in place of its result.

        On a single node the commands are packed by hiredis and sent on one pooled connection as they
        come, in groups of `_SEND_GROUP`, so that the server works on the first ones while the next ones
        are encoded; the answers are read at the end. (redis-py's pipeline sends only once everything is
        encoded, and costs several Python calls per command; a batch sends a thousand APPLY calls.)"""
        client = self._client
        if _pack_command is None or not isinstance(client, redis.Redis):
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
                    conn.send_packed_command(group)
                    sent += len(group)
                    group = []
            if group:
                conn.send_packed_command(group)
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

    def _attempt(self, p: _Pending) -> tuple[list[str], list[Any], str]:
        """Keys and arguments of the APPLY script for a step, with the current guesses; and the data prefix."""
        names = self._n(p.tenant)
        gen, expected = self._gen_guess(p.tenant)
        d = names.data(gen)
        base = self._pv_len.get(d)
        if base is None:
            base = self._pv_len[d] = int(self._client.llen(d + "pv"))
        if p.batch is None or p.batch.args[0] != str(base):
            p.batch = _Batch(p.events, base, p.field, p.offset, p.latest, p.lag)
        return [names.gen, *p.batch.keys(d)], [expected, *p.batch.args], d

    def _settle(self, p: _Pending, d: str, result: list[Any]) -> bool:
        """Take the APPLY script's answer; True when the step is done, else the guesses are corrected."""
        code = int(result[0])
        if code == 1:
            self._pv_len[d] = int(result[1])
            return True
        if code == 0:
            old = self._gens.get(p.tenant, 1)
            self._gens[p.tenant] = int(result[1])
            if self.strict_generations and p.tenant not in self._pins:
                raise GenerationChanged(p.tenant, old, int(result[1]))
        elif code == 2:
            self._pv_len[d] = int(result[1])
        else:
            applied = set(result[1:])
            p.events = [e for e in p.events if e[1] not in applied]
            p.batch = None
        return False

    # ---- primitive reads -----------------------------------------------------------------------

    def has_event(self, tenant: str, event_id: str) -> bool:
        with self._guard("has_event", tenant):
            return bool(self._tx(tenant, lambda p, d: p.sismember(d + "ev", event_id))[0])

    def applied_offset(self, tenant: str, topic: str, partition: int) -> int | None:
        """The offset stored by the last commit_batch for (topic, partition) of the tenant, or None."""
        with self._guard("applied_offset", tenant):
            value = self._tx(tenant, lambda p, d: p.hget(d + "m", _offset_field(topic, partition)))[0]
        return None if value is None else int(value)

    def entity_recorded_at(self, tenant: str, entity: str) -> Micros | None:
        with self._guard("entity_recorded_at", tenant):
            value = self._tx(tenant, lambda p, d: p.lindex(d + "x:" + _escape(entity), 0))[0]
        return None if value is None else int(value)

    def recorded_many(self, tenant: str, entities: list[str]) -> list[Micros | None]:
        """First recorded_at of several entities in one transaction."""
        if not entities:
            return []

        def fill(p: Any, d: str) -> None:
            for e in entities:
                p.lindex(d + "x:" + _escape(e), 0)
        with self._guard("recorded_many", tenant):
            values = self._tx(tenant, fill)
        return [None if v is None else int(v) for v in values]

    def keys(self, tenant: str, entity: str) -> list[Key]:
        with self._guard("keys", tenant):
            raw = self._tx(tenant, lambda p, d: p.lrange(d + "x:" + _escape(entity), 1, -1))[0]
        return [_index_key(entity, element) for element in raw]

    def index(self, tenant: str, entity: str) -> tuple[Micros, list[Key]] | None:
        """First recorded_at and keys from the entity's index list in one LRANGE."""
        with self._guard("index", tenant):
            raw = self._tx(tenant, lambda p, d: p.lrange(d + "x:" + _escape(entity), 0, -1))[0]
        if not raw:
            return None
        return int(raw[0]), [_index_key(entity, element) for element in raw[1:]]

    def as_of_many(self, tenant: str, keys: list[Key], at: Micros,
                   known_at: Micros | None) -> list[Version | None]:
        if not keys:
            return []
        if known_at is not None:
            return [tl.as_of(at, known_at) for tl in self._timelines(tenant, keys)]
        prefixes = [prefix_of(k) for k in keys]
        owners = [_escape(k[1]) for k in keys]
        t = _clamped_point(at)
        with self._guard("as_of_many", tenant):
            result = self._script(tenant, self._as_of,
                                  lambda d: ([d + "pv", *(d + "z:" + o for o in owners)], [t, *prefixes]))
        return [_version_at(row, at) if row else None for row in result[1:]]

    def versions_many(self, tenant: str, keys: list[Key], known_at: Micros | None) -> list[list[Version]]:
        if not keys:
            return []
        return [tl.versions(known_at) for tl in self._timelines(tenant, keys)]

    def read_views(self, requests: list[ViewRequest], at: Micros, known_at: Micros | None) -> list[EntityView | None]:
        """Each view by one VIEW script call (index, as-of winners, relation timelines, provenance), all
        requests in one round trip; with `known_at`, whole timelines folded here."""
        if not requests:
            return []
        common = ["1" if known_at is not None else "", _clamped_point(at)]

        def build(r: ViewRequest) -> Build:
            e = _escape(r.entity)
            scopes = ["0"] if r.scopes is None else ["1", *(_escape(s) for s in r.scopes)]
            return lambda d: ([d + "pv", d + "x:" + e, d + "z:" + e, d + "m"], [*common, r.parts, d + "z:", *scopes])
        with self._guard("view", requests[0].tenant if len(requests) == 1 else None):
            results = self._script_many(self._view, [(r.tenant, build(r)) for r in requests])
        return [_decode_view(r.entity, result, at, known_at) for r, result in zip(requests, results)]

    def _timelines(self, tenant: str, keys: list[Key], gen: int | None = None,
                   provenance: _Provenance | None = None) -> list[Timeline]:
        """Whole timelines with provenance, by the READ script in chunks: all of the current generation
        (restarting when it switches between chunks), or all of `gen` when given."""
        names = self._n(tenant)
        resolve = "0" if provenance is not None else "1"
        for _ in range(_RETRIES):
            g, expected = (gen, "") if gen is not None else self._gen_guess(tenant)
            d = names.data(g)
            out: list[Timeline] = []
            stale = None
            for chunk in _chunks(keys):
                zsets = [d + "z:" + _escape(k[1]) for k in chunk]
                with self._guard("versions", tenant):
                    result = self._read(keys=[names.gen, d + "pv", *zsets],
                                        args=[expected, resolve, *(prefix_of(k) for k in chunk)])
                if result[0] == 0:
                    stale = result[1]
                    break
                prov = provenance or _Provenance()
                pairs = result[2]
                for i in range(0, len(pairs), 2):
                    prov.add(pairs[i], pairs[i + 1])
                out += (_timeline(members, prov) for members in result[1])
            if stale is None:
                return out
            self._gens[tenant] = int(stale)
        raise StoreUnavailable(f"the generation of tenant {tenant!r} kept changing", tenant=tenant)

    def event_ids(self, tenant: str) -> list[str]:
        with self._guard("event_ids", tenant):
            return sorted(self._tx(tenant, lambda p, d: p.smembers(d + "ev"))[0])

    def freshness(self, tenant: str) -> Freshness:
        """known_through and lag from the meta hash (what the workers' last commits stored)."""
        with self._guard("freshness", tenant):
            return _freshness(self._tx(tenant, lambda p, d: p.hmget(d + "m", "kt", "lag"))[0])

    def search_version(self, tenant: str) -> object:
        """(generation, write counter): changes with every applied write and every generation switch."""
        with self._guard("search_version", tenant):
            value = self._tx(tenant, lambda p, d: p.hget(d + "m", "sv"))[0]
        return (self._gen_guess(tenant)[0], int(value or 0))

    def tenants(self) -> list[str]:
        """Tenants of the namespace whose current generation holds data, sorted."""
        with self._guard("tenants"):
            members = sorted(self._client.smembers(self._registry))
            if not members:
                return []
            pipe = self._client.pipeline(transaction=False)
            for t in members:
                pipe.get(self._n(t).gen)
            gens = [self._pins.get(t) or int(g or 1) for t, g in zip(members, pipe.execute())]
            pipe = self._client.pipeline(transaction=False)
            for t, g in zip(members, gens):
                d = self._n(t).data(g)
                pipe.exists(d + "ev", d + "ents")
            return [t for t, n in zip(members, pipe.execute()) if n]

    # ---- whole-tenant walks (of the generation current when they start) -----------------------

    def _snapshot_gen(self, tenant: str) -> int:
        pinned = self._pins.get(tenant)
        if pinned is not None:
            return pinned
        gen = int(self._client.get(self._n(tenant).gen) or 1)
        self._gens[tenant] = gen
        return gen

    def _entity_index(self, d: str) -> dict[str, list[str]]:
        """Every entity of a generation with its index list elements (first recorded_at dropped)."""
        entities = sorted(self._client.smembers(d + "ents"))
        out: dict[str, list[str]] = {}
        for chunk in _chunks(entities):
            pipe = self._client.pipeline(transaction=False)
            for e in chunk:
                pipe.lrange(d + "x:" + _escape(e), 1, -1)
            for e, elements in zip(chunk, pipe.execute()):
                out[e] = elements
        return out

    def _all_provenance(self, d: str) -> _Provenance:
        prov = _Provenance(fetch=lambda n: self._client.lindex(d + "pv", n))
        size = int(self._client.llen(d + "pv"))
        for start in range(0, size, 10 * _CHUNK):
            entries = self._client.lrange(d + "pv", start, start + 10 * _CHUNK - 1)
            for i, text in enumerate(entries):
                prov.add(start + i, text)
        return prov

    def dump(self, tenant: str) -> Iterator[tuple[Key, list[Assertion]]]:
        with self._guard("dump", tenant):
            gen = self._snapshot_gen(tenant)
            d = self._n(tenant).data(gen)
            keys = sorted({_index_key(e, el) for e, elements in self._entity_index(d).items() for el in elements})
            prov = self._all_provenance(d)
        for chunk in _chunks(keys):
            for key, tl in zip(chunk, self._timelines(tenant, chunk, gen=gen, provenance=prov)):
                yield key, list(tl.assertions())

    def search_documents(self, tenant: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """(entity, type, latest labels): reads only the last assertion of each label timeline."""
        with self._guard("search_documents", tenant):
            d = self._n(tenant).data(self._snapshot_gen(tenant))
            index = self._entity_index(d)
            labels: list[tuple[str, str, str]] = []
            for entity, elements in index.items():
                for el in elements:
                    if el.startswith("l|"):
                        key, _ = key_of(entity, el)
                        if key[2] != REF_LABEL:
                            labels.append((entity, key[2], el))
            values: dict[str, dict[str, Any]] = {e: {} for e in index}
            for chunk in _chunks(labels):
                pipe = self._client.pipeline(transaction=False)
                for entity, _, p in chunk:
                    pipe.zrevrangebylex(d + "z:" + _escape(entity), "(" + p + "~", "[" + p, start=0, num=1)
                for (entity, name, p), top in zip(chunk, pipe.execute()):
                    if top:
                        _, _, value, closed, _ = decode_member(top[0][len(p):])
                        if not closed:
                            values[entity][name] = value
        for entity in sorted(values):
            yield entity, entity.partition(":")[0], dict(sorted(values[entity].items()))

    # ---- generations ---------------------------------------------------------------------------

    def current_generation(self, tenant: str) -> int:
        """The generation reads and writes of this tenant go to (1 until switched)."""
        with self._guard("current_generation", tenant):
            gen = int(self._client.get(self._n(tenant).gen) or 1)
        self._gens[tenant] = gen
        return gen

    def new_generation(self, tenant: str) -> int:
        """A generation number never handed out before for this tenant (empty, not current)."""
        n = self._n(tenant)
        with self._guard("new_generation", tenant):
            return int(self._new_gen(keys=[n.gen, n.gseq]))

    def for_generation(self, tenant: str, gen: int) -> RedisStore:
        """A view sharing this connection whose reads and writes of `tenant` go to generation `gen`."""
        self._n(tenant)
        if int(gen) < 1:
            raise UsageError(f"bad generation {gen!r}: generations start at 1")
        view = RedisStore(self._client, namespace=self.namespace, pins={**self._pins, tenant: int(gen)},
                          owns_client=False)
        view._registered = self._registered
        return view

    def load_generation(self, tenant: str, gen: int) -> GenerationLoader:
        """A bulk loader of the empty generation `gen` of `tenant`, which must not be current (nobody reads it
        until a switch): steps as `commit_batch` takes them, written without the APPLY script."""
        if int(gen) < 1:
            raise UsageError(f"bad generation {gen!r}: generations start at 1")
        return GenerationLoader(self, tenant, int(gen))

    def switch_generation(self, tenant: str, gen: int) -> None:
        """Make `gen` the tenant's current generation, atomically for every reader and writer."""
        if int(gen) < 1:
            raise UsageError(f"bad generation {gen!r}: generations start at 1")
        n = self._n(tenant)
        with self._guard("switch_generation", tenant):
            self._register(tenant)
            self._switch(keys=[n.gen, n.gseq], args=[int(gen)])
        self._gens[tenant] = int(gen)

    def switch_when_caught_up(self, tenant: str, expected: int, gen: int,
                              positions: Sequence[tuple[str, int]]) -> bool | str:
        """Cut over to `gen` atomically if the current generation is still `expected` and `gen` has applied
        at least as far as the current one on every (topic, partition). True when switched; False when the
        current generation moved; else the lagging offset field (read further and try again)."""
        n = self._n(tenant)
        with self._guard("switch_when_caught_up", tenant):
            self._register(tenant)
            result = self._switch_if(keys=[n.gen, n.gseq, n.data(int(expected)) + "m", n.data(int(gen)) + "m"],
                                     args=[str(int(expected)), int(gen),
                                           *(_offset_field(t, p) for t, p in positions)])
        if int(result[0]) == 1:
            self._gens[tenant] = int(gen)
            return True
        return False if int(result[0]) == 0 else str(result[1])

    def drop_generation(self, tenant: str, gen: int) -> int:
        """Delete a generation that is not current, through its entity index; returns keys deleted."""
        if int(gen) == self.current_generation(tenant):
            raise UsageError(f"generation {gen} is the current generation of tenant {tenant!r}; "
                             f"switch to another one before dropping it")
        return self._drop_data(tenant, int(gen))

    def _drop_data(self, tenant: str, gen: int) -> int:
        names = self.key_names(tenant, gen)
        self._pv_len.pop(self._n(tenant).data(gen), None)
        with self._guard("drop_generation", tenant):
            pipe = self._client.pipeline(transaction=False)
            for chunk in reversed(list(_chunks(names))):    # the index keys (first chunk) go last
                pipe.execute_command("UNLINK", *chunk)   # (a cluster pipeline's unlink() takes one key)
            return sum(int(n) for n in pipe.execute())

    def key_names(self, tenant: str, gen: int | None = None) -> list[str]:
        """Every Redis key of one generation of a tenant (default: the current one), from its index."""
        with self._guard("key_names", tenant):
            d = self._n(tenant).data(self._snapshot_gen(tenant) if gen is None else int(gen))
            entities = sorted(self._client.smembers(d + "ents"))
        return [d + "ev", d + "m", d + "ents", d + "pv"] + [d + p + _escape(e) for e in entities for p in ("z:", "x:")]

    def drop_tenant(self, tenant: str) -> int:
        """Delete every generation of a tenant and forget it (the log rebuilds it); returns keys deleted."""
        n = self._n(tenant)
        with self._guard("drop_tenant", tenant):
            current, highest = self._client.mget(n.gen, n.gseq)
            top = max(int(current or 1), int(highest or 1))
        deleted = sum(self._drop_data(tenant, g) for g in range(1, top + 1))
        with self._guard("drop_tenant", tenant):
            deleted += int(self._client.unlink(n.gen, n.gseq))
            self._client.srem(self._registry, tenant)
        self._registered.discard(tenant)
        self._gens.pop(tenant, None)
        return deleted

    def drop_namespace(self) -> int:
        """Delete every tenant of the namespace (a cartridge's whole graph); returns keys deleted."""
        with self._guard("drop_namespace"):
            tenants = sorted(self._client.smembers(self._registry))
        deleted = sum(self.drop_tenant(t) for t in tenants)
        with self._guard("drop_namespace"):
            deleted += int(self._client.unlink(self._registry))
        return deleted


# ---- decoding helpers ------------------------------------------------------------------------

def _index_key(entity: str, element: str) -> Key:
    """The timeline key of an index list element of `entity`."""
    if element[0] == ">":
        j = element.index("|")
        return key_of(_unescape(element[1:j]), element[j + 1:])[0]
    return key_of(entity, element)[0]


def _version_at(row: Any, at: Micros) -> Version | None:
    """The AS_OF script's answer for one key: {winner without P, 2 if its point is shared else 1, next point9,
    provenance}."""
    rest, count, nxt, prov_text = row
    point, _, value, closed, expires = decode_member(rest)
    return _winner_version(Assertion(point, value, closed, *_provenance(prov_text), expires), int(count), nxt, at)


def _winner_version(a: Assertion, count: int, nxt: str, at: Micros) -> Version | None:
    """The version valid at `at` from the winner at or before it (folded like Timeline.as_of, known_at=None):
    `count` > 1 when other assertions share its point (a correction), the next point is `nxt` (point9, "" when
    none)."""
    if a.closed:
        return None
    valid_to = decode_point(nxt) if nxt else None
    if a.expires_at is not None and (valid_to is None or a.expires_at < valid_to):
        valid_to = a.expires_at
    if valid_to is not None and valid_to <= at:
        return None
    return Version(a, valid_to, (a.by or a.source) if count > 1 else None)


def _timeline(members: list[str], prov: _Provenance) -> Timeline:
    tl = Timeline()
    for m in members:
        tl.add(prov.assertion(m))
    return tl


def _decode_view(entity: str, result: list[Any], at: Micros, known_at: Micros | None) -> EntityView | None:
    """An EntityView from the VIEW script's answer (None for an entity unknown at `known_at`)."""
    if len(result) == 1 or (known_at is not None and int(result[1]) > known_at):
        return None
    _, _, winners, timelines, pairs, fresh = result
    prov = _Provenance()
    for i in range(0, len(pairs), 2):
        prov.add(pairs[i], pairs[i + 1])
    points: list[tuple[Key, Version | None]] = []
    relations: list[tuple[Key, Version | None]] = []
    for i in range(0, len(winners), 4):
        points.append((key_of(entity, winners[i])[0],
                       _winner_version(prov.assertion(winners[i + 1]), int(winners[i + 2]), winners[i + 3], at)))
    for i in range(0, len(timelines), 2):
        key, tl = _index_key(entity, timelines[i]), _timeline(timelines[i + 1], prov)
        if key[0] == "r":
            relations.append((key, covering(tl.runs(known_at), at)))
        else:
            points.append((key, tl.as_of(at, known_at)))
    return entity_view(entity, points, relations)._replace(freshness=_freshness(fresh))


def _freshness(values: list[Any]) -> Freshness:
    """Freshness from the meta hash's `kt` and `lag` (nil or false when absent)."""
    kt, lag = values
    return Freshness(int(kt) if kt else None, int(lag) if lag else None)
