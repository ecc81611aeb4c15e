"""The Redis store (RedisStore): one segment APPEND per touched entity and step (segments.py, segment_scripts.py).

Its base (store.py's RedisBase) holds the namespace's connection, tenants, generations, offsets and meta hash;
this module holds where an entity's assertions live. A commit step is one APPLY script per tenant: the applied-ids check, one APPEND of a
JSON delta per entity, the first-recorded and entity sets, ids, marks and offsets. When an open segment grows
past segments.ROLL_BYTES the writer closes it (ROLL) with a restatement it computes from that segment, and
indexes it by valid time and by recorded time, so a read now decodes one bounded segment per entity and reads
at other times or as known then decode the few segments the indexes name (segment_views.py). History, dumps
and walks decode every segment.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import ColdTierUnavailable
from ...timeline import Assertion, Timeline, Version, insert, is_void
from ...times import Micros, now_micros
from ..base import (
    BatchStep,
    EntityView,
    EventWrites,
    Key,
    Position,
    Store,
    ViewRequest,
    Window,
)
from . import cold as cold_tier
from . import segment_scripts
from .batch import PendingStep, latest_text, state_behind
from .changelog import encode_copies
from .codec import clamped_point, decode_point
from .event_ids import id_args, note_counts
from .keys import BUCKETS, escape, gen_keys, index_key, key_of, prefix_of
from .loader import BulkLoader
from .retries import KEPT_CONFLICTING, in_current, until_done
from .segment_loader import SegmentLoader
from .segment_views import ViewReader
from .segments import (
    DELTA,
    ROLL_BYTES,
    Fold,
    StepBlocks,
    _assertions,
    _fast_encode,
    _loads,
    decode,
    delta_ranges,
    encode_step,
    recorded_range,
    restate,
)
from .store import GenerationChanged, RedisBase
from .transport import CHUNK, chunks, eval_many, pipelined

WINDOW_SCAN = 2000      # index entries of a timeline with overlapping ranges a change's window scans at most
_DELTA_HEAD = f"[{DELTA},"      # a segment's line holding a delta block (segments.py)


class _Step(PendingStep):
    """A PendingStep with its blocks (encoded once: they do not depend on any guess)."""
    __slots__ = ("blocks",)

    def __init__(self, tenant: str, events: Sequence[EventWrites], position: Position | None) -> None:
        super().__init__(tenant, events, position)
        self.blocks: StepBlocks | None = None


class RedisStore(RedisBase):
    """The Store over Redis (single node or Cluster): entities' data in segments; one namespace per instance."""
    roll_bytes = ROLL_BYTES             # an open segment larger than this is closed (tests use tiny ones)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        client = self._client
        self._seg_apply = client.register_script(segment_scripts.APPLY)
        self._seg_roll = client.register_script(segment_scripts.ROLL)
        self._seg_full = client.register_script(segment_scripts.FULL)
        self._seg_around = client.register_script(segment_scripts.AROUND)
        self._cold_move = client.register_script(cold_tier.MOVE)
        self._views = ViewReader(self)

    # ---- writes --------------------------------------------------------------------------------

    def _commit(self, steps: Sequence[BatchStep], what: str) -> None:
        pending = [_Step(tenant, events, position) for tenant, events, position in steps
                   if events or position is not None]
        if not pending:
            return
        with self._guard(what, pending[0].tenant if len(pending) == 1 else None):
            self._register_all(p.tenant for p in pending)
            until_done(pending, self._apply_segments, lambda p: p.tenant, failure=KEPT_CONFLICTING)

    def _apply_segments(self, pending: list[_Step]) -> list[_Step]:
        """Send each step's APPLY once, with the current guesses, and close the segments they report grown;
        the steps to send again."""
        tries: list[tuple[str, int]] = []
        calls = (self._encode(p, tries) for p in pending)
        results = eval_many(self._client, self._seg_apply, list(calls) if len(pending) == 1 else calls)
        left: list[_Step] = []
        rolls: list[tuple[str, str, int, str]] = []
        for p, (d, gen), result in zip(pending, tries, results):
            code = int(result[0])
            if code == 1:
                note_counts(d, result[1], result[2])     # the ids' counts: the next step's guess (event_ids.py)
                names = list(p.blocks.entities) if p.blocks is not None else []
                rolls += ((p.tenant, d, gen, names[int(e) - 1]) for e in result[3:])
                continue
            if code == 4:
                raise state_behind(p, result[1])
            if code == 0:
                old = self._gens.get(p.tenant, 1)
                self._gens[p.tenant] = int(result[1])
                if self.strict_generations and p.tenant not in self._pins:
                    raise GenerationChanged(p.tenant, old, int(result[1]))
            else:
                p.drop(set(result[1:]))
                p.blocks = None
            left.append(p)
        if rolls:
            self._roll(rolls)
        return left

    def _encode(self, p: _Step, tries: list[tuple[str, int]]) -> tuple[list[str], list[Any]]:
        """The APPLY keys and arguments of a step for the current generation guess; (its data prefix, that
        generation) go to `tries`. Every relation naming an entity as object is sent with each step (SADD: once in the set), not
        remembered here: a store that remembered would miss a set deleted behind its back."""
        names = self._n(p.tenant)
        gen, expected = self._gen_guess(p.tenant)
        d = names.data(gen)
        if p.blocks is None:
            p.blocks = encode_step(p.events)
        sb = p.blocks
        k = gen_keys(d)
        keys = [names.gen, k.meta, k.first]
        ids_latest, id_part = id_args(d, p.ids)   # the ids with their packed marks, by bucket (event_ids.py)
        args: list[Any] = [expected, self.roll_bytes, p.field, p.offset_arg, latest_text(sb.latest), p.lag, ids_latest,
                           *id_part, len(sb.entities)]
        for name, i in sb.entities.items():
            e = escape(name)
            keys += (k.open_segment(e), k.incoming(e))
            incoming = sb.incoming[i]
            if incoming:
                args += (name, sb.min_recorded[i], sb.blocks[i] or "", len(incoming), *incoming)
            else:
                args += (name, sb.min_recorded[i], sb.blocks[i] or "", 0)
        args += encode_copies(p.events)         # the change log (changelog.py)
        tries.append((d, gen))
        return keys, args

    def _roll(self, rolls: list[tuple[str, str, int, str]]) -> None:
        """Close the open segments the APPLY answers reported, each with a restatement of its fold (a whole
        fold when the segment's own is not exact now). A segment appended to meanwhile is left for the next
        step that reports it."""
        segs = pipelined(self._client, [("GET", gen_keys(d).open_segment(escape(name))) for _, d, _, name in rolls])
        now = now_micros()
        calls = []
        for (tenant, d, gen, name), seg in zip(rolls, segs):
            if not isinstance(seg, str) or not seg:
                continue
            blocks = decode(seg)
            fold = Fold(blocks, whole=False)
            if not fold.serves(now):
                try:
                    fold = self._folds(tenant, [name], gen)[name]
                except ColdTierUnavailable:   # its closed history is cold and PostgreSQL down: close it later
                    continue
            e = escape(name)
            index = [x for p, (lo, hi, ends) in delta_ranges(blocks).items()
                     for x in (p, clamped_point(lo), clamped_point(hi), "1" if ends else "")]
            first, last = recorded_range(blocks) or ("", "")
            k = gen_keys(d)
            calls.append(([self._n(tenant).gen, k.closed, k.open_segment(e), k.valid_index(e), k.known_index(e)],
                          ["", e, len(seg.encode()), restate(fold.timelines, now, fold.anchors), first, last,
                           *index]))
        if calls:
            eval_many(self._client, self._seg_roll, calls)

    # ---- reads ---------------------------------------------------------------------------------

    def _folds(self, tenant: str, entities: list[str], gen: int | None = None) -> dict[str, Fold]:
        """Whole folds of entities, all from one generation: the current one (restarting when it switches
        between chunks), or `gen` when given."""
        names = self._n(tenant)
        wanted = list(dict.fromkeys(entities))

        def attempt() -> dict[str, Fold] | None:
            g, expected = (gen, "") if gen is not None else self._gen_guess(tenant)
            d = names.data(g)
            out: dict[str, Fold] = {}
            for chunk in chunks(wanted):
                with self._guard("versions", tenant):
                    k = gen_keys(d)
                    result = self._seg_full(keys=[names.gen, k.closed],
                                            args=[expected, k.segments, *(escape(e) for e in chunk)])
                if result[0] == 0:
                    self._gens[tenant] = int(result[1])
                    return None
                segs = result[1]
                missing = [(escape(e), j) for e, seg in zip(chunk, segs) if isinstance(seg, list)
                           for j, part in enumerate(seg[:-1]) if not part]
                if missing:                  # closed segments in the cold tier (cold.py)
                    found = (cold_tier.fill(self, tenant, g, missing) if gen is not None
                             else cold_tier.fill_current(self, tenant, g, missing))
                    if found is None:        # a cut-over dropped them meanwhile: read the new generation
                        return None
                    segs = [seg if isinstance(seg, str) else "".join(
                        part or found[(escape(e), j)] for j, part in enumerate(seg)) for e, seg in zip(chunk, segs)]
                for e, seg in zip(chunk, segs):
                    out[e] = Fold(decode(seg), whole=True)
            return out
        return in_current(tenant, attempt)

    def _timelines(self, tenant: str, keys: list[Key], gen: int | None = None,
                   provenance: Any = None) -> list[Timeline]:
        folds = self._folds(tenant, [k[1] for k in keys], gen)
        return [folds[k[1]].timelines.get(prefix_of(k)) or Timeline() for k in keys]

    def entity_recorded_at(self, tenant: str, entity: str) -> Micros | None:
        with self._guard("entity_recorded_at", tenant):
            value = self._tx(tenant, lambda p, d: p.hget(gen_keys(d).first, entity))[0]
        return None if value is None else int(value)

    def recorded_many(self, tenant: str, entities: list[str]) -> list[Micros | None]:
        if not entities:
            return []
        with self._guard("recorded_many", tenant):
            values = self._tx(tenant, lambda p, d: p.hmget(gen_keys(d).first, entities))[0]
        return [None if v is None else int(v) for v in values]

    def keys(self, tenant: str, entity: str) -> list[Key]:
        with self._guard("keys", tenant):
            incoming = self._tx(tenant, lambda p, d: p.smembers(gen_keys(d).incoming(escape(entity))))[0]
        own = self._folds(tenant, [entity])[entity].keys(entity)
        return own + [index_key(entity, el) for el in sorted(incoming)]

    def read_views(self, requests: list[ViewRequest], at: Micros, known_at: Micros | None) -> list[EntityView | None]:
        return self._views.read_views(requests, at, known_at)


    # ---- what changed since: windows ----------------------------------------------------------------

    def windows_many(self, tenant: str, items: list[tuple[Key, Micros]], size: int) -> list[Window]:
        """Each (key, point)'s window (keel/changes.py) from the segments the valid-time index names for it and the
        open segment, all read in one AROUND call (segment_scripts.AROUND): the timeline's rows of those segments'
        deltas, cut below the lowest point they hold completely when older segments were left out. A timeline the
        index cannot bound (too many overlapping ranges) or whose next point's winner is a void is read whole (Store's
        default)."""
        if not items:
            return []
        unique = list(dict.fromkeys(items))
        entities = list(dict.fromkeys(key[1] for key, _ in unique))
        where = {e: i for i, e in enumerate(entities, 1)}
        triples = [x for key, point in unique for x in (where[key[1]], prefix_of(key), clamped_point(point))]
        opens = [escape(e) for e in entities]
        used: list[str] = []
        with self._guard("changes", tenant):
            [result] = self._script_many(self._seg_around, [(tenant, lambda d: (
                used.append(d), [], [gen_keys(d).segments, gen_keys(d).valid_indexes, WINDOW_SCAN, len(opens),
                                   *opens, *triples])[1:])])
        _, verdicts, segments = result
        missing = [(x, int(n)) for x, got in zip(opens, segments) for n, seg in zip(got[1::2], got[2::2]) if not seg]
        if missing:                         # closed segments in the cold tier (cold.py)
            cold = cold_tier.fill(self, tenant, cold_tier.generation_of(used[-1]), missing)
            segments = [[got[0], *(x for n, seg in zip(got[1::2], got[2::2])
                                   for x in (n, seg or cold[(e, int(n))]))] for e, got in zip(opens, segments)]
        deltas: dict[tuple[int, Any], list[list[Any]]] = {}

        def blocks(x: int, n: Any, segment: str, p: str) -> list[list[Any]]:
            """The delta blocks of a segment with rows of P, each decoded once, when first asked: a segment's other
            blocks are not decoded (its restatement can hold every timeline of the entity)."""
            lines = deltas.get((x, n))
            if lines is None:
                lines = deltas[(x, n)] = [[line, None] for line in segment.split("\n") if line.startswith(_DELTA_HEAD)]
            name = _fast_encode(p).decode()
            out = []
            for line in lines:
                if name in line[0]:
                    if line[1] is None:
                        line[1] = _loads(line[0])
                    out.append(line[1])
            return out

        found: dict[tuple[Key, Micros], Window] = {}
        whole: list[tuple[Key, Micros]] = []
        for i, item in enumerate(unique):
            key, point = item
            below, ns = verdicts[2 * i], verdicts[2 * i + 1]
            x = where[key[1]]
            got = segments[x - 1]
            closed = dict(zip(got[1::2], got[2::2]))
            if ns == "*":
                whole.append(item)
                continue
            wanted = sorted({int(n) for n in ns})
            p = prefix_of(key)
            low = decode_point(below) if below else None
            entries: list[Assertion] = []
            for n, segment in [*((n, closed[n]) for n in wanted), (None, got[0])]:
                for block in blocks(x, n, segment, p):
                    rows = block[2].get(p)
                    if rows:
                        if low is not None:
                            rows = [row for row in rows if row[0] >= low]
                        for a in _assertions(block[1], rows):
                            insert(entries, a)
            nxt = next((a.point for a in entries if a.point > point), None)
            if nxt is not None:
                last = [a for a in entries if a.point == nxt][-1]
                if is_void(last):
                    whole.append(item)
                    continue
            found[item] = Window(entries, low, nxt, False)
        if whole:
            for item, w in zip(whole, Store.windows_many(self, tenant, whole, size)):
                found[item] = w
        return [found[item] for item in items]

    def versions_many(self, tenant: str, keys: list[Key], known_at: Micros | None) -> list[list[Version]]:
        return [tl.versions(known_at) for tl in self._timelines(tenant, keys)] if keys else []

    def recorded_versions_many(self, tenant: str, keys: list[Key], known_at: Micros | None
                               ) -> list[list[tuple[Version, Assertion | None]]]:
        return [tl.recorded_versions(known_at) for tl in self._timelines(tenant, keys)] if keys else []

    def assertions_many(self, tenant: str, keys: list[Key]) -> list[list[Assertion]]:
        return [list(tl.assertions()) for tl in self._timelines(tenant, keys)] if keys else []

    # ---- whole-tenant walks --------------------------------------------------------------------

    def dump(self, tenant: str) -> Iterator[tuple[Key, list[Assertion]]]:
        """Every timeline by key: one pass per key kind over the entities that own one (keys sort by kind,
        then owner), decoding each entity's segments in chunks."""
        gen, _, entities = self._walk_entities(tenant, "dump")
        kinds: dict[str, list[str]] = {}
        for kind in "eflr":
            todo = entities if kind == "e" else kinds.get(kind, [])
            for chunk in chunks(todo):
                folds = self._folds(tenant, chunk, gen)
                for e in chunk:
                    tls = folds[e].timelines
                    if kind == "e":
                        for k in {p[0] for p in tls} - {"e"}:
                            kinds.setdefault(k, []).append(e)
                    own = sorted((key_of(e, p)[0], tl) for p, tl in tls.items() if p[0] == kind)
                    for key, tl in own:
                        yield key, list(tl.assertions())

    def entity_indexes(self, tenant: str, type: str | None = None) -> Iterator[tuple[str, Micros, list[Key]]]:
        gen, d, entities = self._walk_entities(tenant, "entity_indexes", type)
        for chunk in chunks(entities):
            with self._guard("entity_indexes", tenant):
                pipe = self._client.pipeline(transaction=False)
                k = gen_keys(d)
                pipe.hmget(k.first, chunk)
                for e in chunk:
                    pipe.smembers(k.incoming(escape(e)))
                first, *incoming = pipe.execute()
            folds = self._folds(tenant, chunk, gen)
            for e, rec, inc in zip(chunk, first, incoming):
                if rec is not None:
                    yield e, int(rec), folds[e].keys(e) + [index_key(e, el) for el in sorted(inc)]

    # ---- generations ---------------------------------------------------------------------------

    def key_names(self, tenant: str, gen: int | None = None) -> list[str]:
        """Every Redis key of one generation of a tenant (default: the current one), from its entity set."""
        with self._guard("key_names", tenant):
            d = self._n(tenant).data(self._snapshot_gen(tenant) if gen is None else int(gen))
            k = gen_keys(d)
            entities = sorted(self._client.hkeys(k.first))
            extra = [k.closed, k.changes, k.cold]       # present only when written
            *found, buckets = pipelined(self._client, [*(("EXISTS", x) for x in extra), ("HGET", k.meta, BUCKETS)])
            closed: dict[str, int] = {}
            if int(found[0]):
                closed = {x: int(n) for x, n in self._client.hgetall(k.closed).items()}
        out = k.fixed + [x for x, n in zip(extra, found) if int(n)]
        probed = [k.id_bucket(b) for b in range(int(buckets or 1))]      # the event ids (event_ids.py)
        probed += (name for e in map(escape, entities)
                   for name in (k.open_segment(e), k.incoming(e), k.valid_index(e), k.known_index(e)))
        for chunk in chunks(probed):
            with self._guard("key_names", tenant):
                out += (x for x, n in zip(chunk, pipelined(self._client, [("EXISTS", x) for x in chunk])) if n)
        out += (k.closed_segment(x, j) for x, n in closed.items() for j in range(n))
        return out

    def load_generation(self, tenant: str, gen: int) -> BulkLoader:
        return SegmentLoader(self, tenant, int(gen))



__all__ = ["CHUNK", "RedisStore"]
