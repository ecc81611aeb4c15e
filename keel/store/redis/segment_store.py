"""The Redis store in layout 2: one segment APPEND per touched entity and step (segments.py, segment_scripts.py).

Same Store contract, generations, hash tags and meta hash as layout 1 (store.py); what differs is where an
entity's assertions live. A commit step is one APPLY script per tenant: the applied-ids check, one APPEND of a
JSON delta per entity, the first-recorded and entity sets, ids, marks and offsets. When an open segment grows
past segments.ROLL_BYTES the writer closes it (ROLL) with a restatement it computes from that segment, so a
read now decodes one bounded segment per entity. Reads at other times or with known_at decode every segment.
"""
from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from ...errors import ColdTierUnavailable
from ...timeline import Assertion, Timeline, covering, insert, is_void
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
    entity_view,
    select_keys,
)
from . import cold as cold_tier
from . import segment_scripts
from .batch import PendingStep, latest_of, state_behind
from .changelog import CHANGES, encode_copies
from .codec import clamped_point, decode_point, freshness_of
from .keys import LAYOUT2_DATA_KEYS, MARKS, escape, index_key, key_of, prefix_of, unescape
from .loader import BulkLoader
from .retries import KEPT_CONFLICTING, in_current, until_done
from .segment_loader import SegmentLoader
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
    past_timelines,
    recorded_range,
    restate,
)
from .store import GenerationChanged, RedisStore, store_of_layout
from .transport import CHUNK, chunks, eval_many, pipelined

LAYOUT = 2
WINDOW_SCAN = 2000      # index entries of a timeline with overlapping ranges a change's window scans at most
_DELTA_HEAD = f"[{DELTA},"      # a segment's line holding a delta block (segments.py)
OPTIONAL_KEYS = (MARKS, "sg", CHANGES, cold_tier.COLD)


class _Step(PendingStep):
    """A PendingStep with its blocks (encoded once: they do not depend on any guess)."""
    __slots__ = ("blocks",)

    def __init__(self, tenant: str, events: Sequence[EventWrites], position: Position | None) -> None:
        super().__init__(tenant, events, position)
        self.blocks: StepBlocks | None = None


@store_of_layout
class SegmentStore(RedisStore):
    """A Store over Redis in layout 2 (single node or Cluster); one namespace per instance."""
    layout = LAYOUT
    roll_bytes = ROLL_BYTES             # an open segment larger than this is closed (tests use tiny ones)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        client = self._client
        self._seg_apply = client.register_script(segment_scripts.APPLY)
        self._seg_roll = client.register_script(segment_scripts.ROLL)
        self._seg_view = client.register_script(segment_scripts.VIEW)
        self._seg_full = client.register_script(segment_scripts.FULL)
        self._seg_past = client.register_script(segment_scripts.PAST)
        self._seg_around = client.register_script(segment_scripts.AROUND)
        self._seg_known = client.register_script(segment_scripts.KNOWN)
        self._cold_move = client.register_script(cold_tier.MOVE)

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
                names = list(p.blocks.entities) if p.blocks is not None else []
                rolls += ((p.tenant, d, gen, names[int(e) - 1]) for e in result[1:])
                continue
            if code == 4:
                raise state_behind(p, result[1])
            if code == 0:
                old = self._gens.get(p.tenant, 1)
                self._gens[p.tenant] = int(result[1])
                if self.strict_generations and p.tenant not in self._pins:
                    raise GenerationChanged(p.tenant, old, int(result[1]))
            else:
                applied = set(result[1:])
                p.events = [e for e in p.events if e[1] not in applied]
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
        ids = [event_id for _, event_id in p.events if event_id]
        marks = [x for event_id in ids if getattr(event_id, "mark", None) for x in (event_id, event_id.mark)]
        keys = [names.gen, d + "ev", d + "m", d + "ents", d + "fr", d + MARKS]
        args: list[Any] = [expected, self.roll_bytes, p.field, p.offset_arg, p.latest, p.lag, latest_of(ids),
                           len(ids), *ids, len(marks) // 2, *marks, len(sb.entities)]
        for name, i in sb.entities.items():
            e = escape(name)
            keys += (d + "s:" + e, d + "i:" + e)
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
        segs = pipelined(self._client, [("GET", d + "s:" + escape(name)) for _, d, _, name in rolls])
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
            calls.append(([self._n(tenant).gen, d + "sg", d + "s:" + e, d + "v:" + e, d + "k:" + e],
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
                    result = self._seg_full(keys=[names.gen, d + "sg"],
                                            args=[expected, d + "s:", *(escape(e) for e in chunk)])
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
            value = self._tx(tenant, lambda p, d: p.hget(d + "fr", entity))[0]
        return None if value is None else int(value)

    def recorded_many(self, tenant: str, entities: list[str]) -> list[Micros | None]:
        if not entities:
            return []
        with self._guard("recorded_many", tenant):
            values = self._tx(tenant, lambda p, d: p.hmget(d + "fr", entities))[0]
        return [None if v is None else int(v) for v in values]

    def keys(self, tenant: str, entity: str) -> list[Key]:
        with self._guard("keys", tenant):
            incoming = self._tx(tenant, lambda p, d: p.smembers(d + "i:" + escape(entity)))[0]
        own = self._folds(tenant, [entity])[entity].keys(entity)
        return own + [index_key(entity, el) for el in sorted(incoming)]

    def read_views(self, requests: list[ViewRequest], at: Micros, known_at: Micros | None) -> list[EntityView | None]:
        """Each view from one VIEW call (the entity's open segment and those of the subjects of relations naming
        it), all in one round trip. A view those segments do not serve (an earlier `at`, a restatement made
        inexact) reads the closed segments the valid-time index names (PAST), and whole folds where the index
        cannot bound the read (overlapping ranges, voids, relations with ends). A read with `known_at` first asks
        the recorded-time index which segment of each entity stands for what was known then
        (`_known_segments`), and reads it as if it were the open one."""
        if not requests:
            return []

        def build(r: ViewRequest) -> Any:
            e = escape(r.entity)
            return lambda d: ([d + "s:" + e, d + "i:" + e, d + "m", d + "fr"],
                              [d + "s:", r.entity, "1" if "r" in r.parts else ""])
        with self._guard("view", requests[0].tenant if len(requests) == 1 else None):
            results = self._script_many(self._seg_view, [(r.tenant, build(r)) for r in requests])
        known = self._known_segments(requests, results, known_at) if known_at is not None else {}
        out: list[EntityView | None] = []
        for i, (r, result) in enumerate(zip(requests, results)):
            if len(result) == 1 or (known_at is not None and int(result[1]) > known_at):
                out.append(None)
                continue
            _, _, seg, elements, segs, meta = result
            subs = known.get(i, {})
            opens = {r.entity: seg, **{_owner(el): s for el, s in zip(elements, segs)}}
            if any(sub is None or not _known_after(opens[e], known_at) for e, sub in subs.items()):
                # no usable recorded-time index, or an open segment holding writes known then: every segment
                timelines = self._whole(r.tenant, [r.entity, *(_owner(el) for el in elements)])
                out.append(_view(r, timelines, elements, at, known_at)._replace(freshness=freshness_of(meta)))
                continue
            own = Fold(decode(subs[r.entity][1] if r.entity in subs else seg), whole=False)
            subjects: dict[str, Fold] = {}
            for el, s in zip(elements, segs):
                owner = _owner(el)
                if owner not in subjects:
                    subjects[owner] = Fold(decode(subs[owner][1] if owner in subs else s), whole=False)
            timelines = {r.entity: own.timelines, **{o: f.timelines for o, f in subjects.items()}}
            if not own.serves(at) or not all(f.serves(at) for f in subjects.values()):
                timelines = self._past(r, own, elements, at, subs)
            view = _view(r, timelines, elements, at, known_at)
            out.append(view._replace(freshness=freshness_of(meta)))
        return out

    def _whole(self, tenant: str, entities: list[str]) -> dict[str, dict[str, Timeline]]:
        return {e: f.timelines for e, f in self._folds(tenant, entities).items()}

    def _known_segments(self, requests: list[ViewRequest], results: list[list[Any]], known_at: Micros,
                        ) -> dict[int, dict[str, tuple[int, str] | None]]:
        """For reads with `known_at`: per request (by index), the entities (the viewed one, the subjects of
        relations naming it) whose open segment holds writes recorded after `known_at`, each mapped to the closed
        segment that then stands in for the open one, (its number, its body), or None when the index cannot tell
        (a namespace written before it existed, or writes whose recorded_at went back).

        A tenant's recorded_at never goes back (docs/envelope.md), so an entity's segments hold ever later writes:
        with m the first closed segment holding a write recorded after `known_at`, every earlier segment is known
        then, every later one is not, and segment m (its restatement of the earlier ones, its own deltas cut by
        `known_at` when folded) answers exactly what the whole history cut by `known_at` answers, at the times
        its restatement serves; otherwise `_past` reads the earlier closed segments the valid-time index names."""
        asked: list[tuple[int, list[str]]] = []
        for i, (r, result) in enumerate(zip(requests, results)):
            if len(result) > 1 and int(result[1]) <= known_at:
                asked.append((i, list(dict.fromkeys([r.entity, *(_owner(el) for el in result[3]), ]))))
        if not asked:
            return {}
        used: list[str] = []

        def build(entities: list[str]) -> Any:
            return lambda d: (used.append(d), [d + "sg"], [d + "s:", d + "k:", known_at, *map(escape, entities)])[1:]
        with self._guard("view", requests[0].tenant if len(requests) == 1 else None):
            answers = self._script_many(self._seg_known, [(requests[i].tenant, build(es)) for i, es in asked])
        out: dict[int, dict[str, tuple[int, str] | None]] = {}
        for (i, entities), answer, d in zip(asked, answers, used[-len(asked):]):
            subs: dict[str, tuple[int, str] | None] = {}
            for e, got in zip(entities, answer[1]):
                if got == "*":
                    subs[e] = None
                elif got:
                    n, body = int(got[0]), got[1]
                    if not body:                # moved to the cold tier (cold.py)
                        tenant, g = requests[i].tenant, cold_tier.generation_of(d)
                        found = cold_tier.fill_current(self, tenant, g, [(escape(e), n)])
                        if found is None:       # a cut-over dropped it meanwhile: whole folds of the new generation
                            subs[e] = None
                            continue
                        body = found[(escape(e), n)]
                    subs[e] = (n, body)
            out[i] = subs
        return out

    def _past(self, r: ViewRequest, own: Fold, elements: list[str], at: Micros,
              subs: dict[str, tuple[int, str] | None] | None = None) -> dict[str, dict[str, Timeline]]:
        """The timelines a view at a past `at` reads: per entity (the viewed one, the subjects of relations naming
        it), from the closed segments the valid-time index names and the open segment, all read in one PAST call;
        an entity the index cannot bound for one of them is folded whole. `subs` (`_known_segments`): entities
        whose closed segment m stands in for the open one; their segments from m on are not read, and an entity
        for which the index names a later one is folded whole."""
        wanted: dict[str, list[str]] = {}
        point_keys, rel_keys = select_keys((key_of(r.entity, p)[0] for p in own.timelines), r.scopes, r.parts)
        wanted[r.entity] = [prefix_of(k) for k in (*point_keys, *rel_keys)]
        if "r" in r.parts:
            for el in elements:
                wanted.setdefault(_owner(el), []).append(el[el.index("|") + 1:])
        entities = list(wanted)
        triples = [x for i, (e, ps) in enumerate(wanted.items(), 1) for p in ps for x in (i, p, "r" if p[0] == "r" else "")]
        opens = [escape(e) for e in entities]
        t9 = clamped_point(at)
        used: list[str] = []
        with self._guard("view", r.tenant):
            [result] = self._script_many(self._seg_past, [(r.tenant, lambda d: (
                used.append(d), [], [d + "s:", d + "v:", t9, len(opens), *opens, *triples])[1:])])
        _, verdicts, segments = result
        missing = [(x, int(n)) for x, got in zip(opens, segments) for n, seg in zip(got[1::2], got[2::2]) if not seg]
        if missing:                         # closed segments in the cold tier (cold.py)
            g = cold_tier.generation_of(used[-1])
            found = (cold_tier.fill(self, r.tenant, g, missing) if r.tenant in self._pins
                     else cold_tier.fill_current(self, r.tenant, g, missing))
            if found is None:               # a cut-over dropped them meanwhile: whole folds of the new generation
                return self._whole(r.tenant, entities)
            segments = [[got[0], *(x for n, seg in zip(got[1::2], got[2::2])
                                   for x in (n, seg or found[(e, int(n))]))] for e, got in zip(opens, segments)]
        out: dict[str, dict[str, Timeline]] = {}
        whole: list[str] = []
        verdict = iter(verdicts)
        for e, got in zip(entities, segments):
            ps = wanted[e]
            flagged = [bool(next(verdict)) for _ in ps]
            sub = (subs or {}).get(e)
            if sub is None:
                chosen = [*got[2::2], got[0]]
            else:
                m, body = sub
                chosen = [seg for n, seg in zip(got[1::2], got[2::2]) if int(n) < m] + [body]
                if any(int(n) > m for n in got[1::2]):
                    flagged.append(True)
            tls = None if any(flagged) else past_timelines(chosen, ps)
            if tls is None:
                whole.append(e)
            else:
                out[e] = tls
        if whole:
            out.update(self._whole(r.tenant, whole))
        return out

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
                used.append(d), [], [d + "s:", d + "v:", WINDOW_SCAN, len(opens), *opens, *triples])[1:])])
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
                pipe.hmget(d + "fr", chunk)
                for e in chunk:
                    pipe.smembers(d + "i:" + escape(e))
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
            entities = sorted(self._client.smembers(d + "ents"))
            extra = [d + k for k in OPTIONAL_KEYS]
            found = [int(n) for n in pipelined(self._client, [("EXISTS", k) for k in extra])]
            closed: dict[str, int] = {}
            if found[1]:
                closed = {k: int(v) for k, v in self._client.hgetall(d + "sg").items()}
        out = [d + k for k in LAYOUT2_DATA_KEYS] + [k for k, n in zip(extra, found) if n]
        per_entity = [d + p + escape(e) for e in entities for p in ("s:", "i:", "v:", "k:")]
        for chunk in chunks(per_entity):
            with self._guard("key_names", tenant):
                out += (k for k, n in zip(chunk, pipelined(self._client, [("EXISTS", k) for k in chunk])) if n)
        out += (f"{d}s:{x}|{j}" for x, n in closed.items() for j in range(n))
        return out

    def load_generation(self, tenant: str, gen: int) -> BulkLoader:
        return SegmentLoader(self, tenant, int(gen))

    def for_generation(self, tenant: str, gen: int) -> SegmentStore:
        view = super().for_generation(tenant, gen)
        assert isinstance(view, SegmentStore)
        return view        # type(self): a subclass's settings stay


def _known_after(open_segment: str, known_at: Micros | None) -> bool:
    """Whether every delta of an open segment was recorded after `known_at`: then a closed segment can stand in
    for what was known (`SegmentStore._known_segments`), which the closed ones' index alone cannot promise."""
    got = recorded_range(decode(open_segment))
    return known_at is not None and (got is None or got[0] > known_at)


def _owner(element: str) -> str:
    """The subject named by an element `>` + escaped subject + `|` + P of an entity's incoming relations."""
    return unescape(element[1:element.index("|")])


def _view(r: ViewRequest, timelines: dict[str, dict[str, Timeline]], elements: list[str], at: Micros,
          known_at: Micros | None) -> EntityView:
    """The view of one entity from its timelines and those of the subjects of relations naming it (by entity,
    then P)."""
    keyed: dict[Key, Timeline] = {key_of(r.entity, p)[0]: tl for p, tl in timelines[r.entity].items()}
    for el in elements:
        key = index_key(r.entity, el)
        tl = timelines.get(key[1], {}).get(el[el.index("|") + 1:])
        if tl is not None:
            keyed[key] = tl
    point_keys, rel_keys = select_keys(keyed, r.scopes, r.parts)
    return entity_view(r.entity, ((k, keyed[k].as_of(at, known_at)) for k in point_keys),
                       ((k, covering(keyed[k].runs(known_at), at)) for k in rel_keys))


__all__ = ["CHUNK", "LAYOUT", "SegmentStore"]
