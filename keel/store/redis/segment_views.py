"""Layout 2's views: what `context` reads of an entity, now, at a past time and as known at a past time.

A view reads the entity's open segment and those of the subjects of relations naming it (VIEW, one round
trip; an entity viewed before, whose subjects are known, by plain commands in one MULTI instead, the subjects'
segments by MGET); those serve reads at or after their restatements' anchors. Each segment is folded once per
text (FoldCache): a view now decodes only the segments that changed since the last view of this process, and of
a subject only the relations naming the viewed entity; a view believed now is kept by the texts it was read from
and reused while the time stays where its answer holds (`PresentViews`). A read with `known_at` first asks the recorded-time index
which closed segment of each entity stands for what was known then (KNOWN). A read at an earlier time reads the
closed segments the valid-time index names (PAST), and, where those do not answer exactly, reads around the time
until they do (INDEX and SEGMENTS, segment_past.py); whole histories only as the
last resort. The scripts are in segment_scripts.py; the store (segment_store.py) owns the connection, the
generation checks and the cold tier.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import redis

from ...timeline import Timeline, covering
from ...times import Micros
from ..base import EntityView, Key, ViewRequest, entity_view, select_keys
from . import cold as cold_tier
from . import segment_past, segment_scripts
from .codec import clamped_point, freshness_of
from .keys import escape, gen_keys, generation_of, index_key, key_of, prefix_of, unescape
from .segments import Fold, decode, past_timelines, recorded_range
from .text_cache import CLOSED, FoldCache, TextBudget
from .transport import pipelined


class ViewHost(cold_tier.ColdTierHost, Protocol):
    """What the view reads use of segment_store.RedisStore (named here, not imported: that module imports
    this one): its generation-checked script calls, whole folds and pinned generations."""
    _pins: Any

    def _script_many(self, script: Any, calls: Sequence[tuple[str, Any]]) -> list[list[Any]]: ...
    def _n(self, tenant: str) -> Any: ...
    def _gen_guess(self, tenant: str) -> tuple[int, str]: ...
    def _folds(self, tenant: str, entities: list[str], gen: int | None = None) -> dict[str, Fold]: ...


class PresentViews(TextBudget[tuple[Any, ...], tuple[Micros, Micros | None, EntityView]]):
    """Views believed now, kept by what they were read from (tenant, entity, scopes, parts, the open segments'
    texts and the elements naming the subjects) with the span of times where each holds, and handed out again
    (copied: callers may change what they get) while `at` stays inside it. Once the folds were cached, shaping a
    debt's view from them at every call (25 relations, the facts), the 26 fold look-ups and their `serves` checks
    were most of a `context` now, though nothing read had changed.

    The span: from where every fold read serves (`Fold.serves` is t >= each restatement anchor) and the greatest
    point or expiry <= `at` of every timeline read, to the least point or expiry > `at` (`Timeline.steady`).
    Keyed by the texts themselves, a hit is exactly what building the view again gives; at most `budget`
    characters of text, the oldest going first."""

    BUDGET = 4 << 20

    def get(self, key: tuple[Any, ...], at: Micros) -> EntityView | None:
        got = self._kept(key)
        if got is None or at < got[0] or (got[1] is not None and at >= got[1]):
            return None
        return _copied(got[2])

    def build(self, key: tuple[Any, ...], size: int, r: ViewRequest, own: Fold, subjects: dict[str, Fold],
              elements: list[str], at: Micros) -> EntityView:
        """The view at `at` from folds that all serve it (read as believed now), kept under `key`, counted as
        `size` characters of text (those of the segments it was read from)."""
        point_keys, rel_keys, keyed = _keyed(r, {r.entity: own.timelines,
                                                 **{o: f.timelines for o, f in subjects.items()}}, elements)
        low = max((a for f in (own, *subjects.values()) for a in f.anchors.values()), default=_EARLIEST)
        high: Micros | None = None
        for k in (*point_keys, *rel_keys):
            lo, hi = keyed[k].steady(at)
            if lo is not None and lo > low:
                low = lo
            if hi is not None and (high is None or hi < high):
                high = hi
        view = _entity_view(r.entity, point_keys, rel_keys, keyed, at, None)
        self._keep(key, size, (low, high, view))
        return _copied(view)


_EARLIEST = -(1 << 62)       # before every time: a span with no lower bound


def _copied(view: EntityView) -> EntityView:
    return view._replace(info=view.info._replace(labels=dict(view.info.labels)),
                         facts=[dict(f) for f in view.facts], relations=[dict(x) for x in view.relations])


SUBJECTS_KEPT = 100_000           # subjects' names remembered for views by MGET, in all (a few MB)


class ViewReader:
    """The view reads of one RedisStore (its `read_views`), with the scripts they run."""

    def __init__(self, store: ViewHost) -> None:
        self.store = store
        client = store.client
        self._view_script = client.register_script(segment_scripts.VIEW)
        self._known_script = client.register_script(segment_scripts.KNOWN)
        self._past_script = client.register_script(segment_scripts.PAST)
        self._index_script = client.register_script(segment_scripts.INDEX)
        self._segments_script = client.register_script(segment_scripts.SEGMENTS)
        self._folds = FoldCache()
        self._views = PresentViews()
        self._subjects: dict[tuple[str, str], list[str]] = {}    # (tenant, entity) -> escaped subjects, last seen
        self._subjects_held = 0

    def read_views(self, requests: list[ViewRequest], at: Micros, known_at: Micros | None) -> list[EntityView | None]:
        """Each view from one VIEW call (the entity's open segment and those of the subjects of relations naming
        it), all in one round trip. A view those segments do not serve (an earlier `at`, a restatement made
        inexact) reads the closed segments the valid-time index names (PAST) and, where those do not answer
        exactly (overlapping ranges, voids, relations with ends), around `at` until they do (`_widened`). A read
        with `known_at` first asks the recorded-time index which segment of each entity stands for what was known
        then (`_known_segments`), and reads it as if it were the open one. Whole histories only when nothing
        bounds the read."""
        if not requests:
            return []

        def build(r: ViewRequest) -> Any:
            e, relations = escape(r.entity), "1" if "r" in r.parts else ""

            def keys_and_args(d: str) -> tuple[list[str], list[Any]]:
                k = gen_keys(d)
                return [k.open_segment(e), k.incoming(e), k.meta, k.first], [k.segments, r.entity, relations]
            return keys_and_args
        with self.store._guard("view", requests[0].tenant if len(requests) == 1 else None):
            results = self._with_mget(requests)
            if results is None:
                results = self.store._script_many(self._view_script, [(r.tenant, build(r)) for r in requests])
                self._remember(requests, results)
        known = self._known_segments(requests, results, known_at) if known_at is not None else {}
        out: list[EntityView | None] = []
        for i, (r, result) in enumerate(zip(requests, results)):
            if len(result) == 1 or (known_at is not None and int(result[1]) > known_at):
                out.append(None)
                continue
            _, _, seg, elements, segs, meta = result
            subs = known.get(i, {})
            opens = {r.entity: seg, **{_owner(el): s for el, s in zip(elements, segs)}} if subs else {}
            if any(sub is None or not _known_after(opens[e], known_at) for e, sub in subs.items()):
                # no usable recorded-time index, or an open segment holding writes known then: every segment
                timelines = self._whole(r.tenant, [r.entity, *(_owner(el) for el in elements)])
                out.append(_view(r, timelines, elements, at, known_at)._replace(freshness=freshness_of(meta)))
                continue
            present = None if known_at is not None else (
                r.tenant, r.entity, None if r.scopes is None else tuple(r.scopes), r.parts, seg, tuple(elements),
                tuple(segs))
            if present is not None:
                kept = self._views.get(present, at)
                if kept is not None:
                    out.append(kept._replace(freshness=freshness_of(meta)))
                    continue
            own = self._folds.get(subs[r.entity][1] if r.entity in subs else seg)
            texts: dict[str, str] = {}
            wanted: dict[str, list[str]] = {}
            for el, s in zip(elements, segs):
                key, p = _parsed(r.entity, el)
                owner = key[1]
                if owner not in texts:
                    texts[owner] = subs[owner][1] if owner in subs else s
                    wanted[owner] = []
                wanted[owner].append(p)
            subjects = {owner: self._folds.get(text, wanted[owner]) for owner, text in texts.items()}
            if not (own.serves(at) and all(f.serves(at) for f in subjects.values())):
                view = _view(r, self._past(r, own, elements, at, known_at, subs), elements, at, known_at)
            elif present is not None:
                view = self._views.build(present, len(seg) + sum(map(len, segs)), r, own, subjects, elements, at)
            else:
                view = _view(r, {r.entity: own.timelines, **{o: f.timelines for o, f in subjects.items()}},
                             elements, at, known_at)
            out.append(view._replace(freshness=freshness_of(meta)))
        return out

    def _with_mget(self, requests: list[ViewRequest]) -> list[list[Any]] | None:
        """VIEW's answers read without the script, by plain commands in one MULTI on a single node: the entity's
        first recorded_at, the meta hash's kt and lag, its incoming relations, and one MGET of the tenant's
        generation, its open segment and those of the subjects its last view named (`_subjects`). Lua copies
        every string a script reads into a Lua string: VIEW cost 58 us of Redis CPU for a debt with 25 dues,
        these commands 7. None (read with VIEW, `_script_many`) on Redis Cluster, when a request reads
        relations of an entity not viewed before, when its relations name a subject its last view did not (the
        MGET missed it) or when a tenant's generation switched (read in the same MULTI, checked as GEN_CHECK)."""
        store = self.store
        client = store.client
        if not isinstance(client, redis.Redis):
            return None
        known = [self._subjects.get((r.tenant, r.entity)) if "r" in r.parts else () for r in requests]
        if any(subjects is None for subjects in known):
            return None
        calls: list[tuple[Any, ...]] = [("MULTI",)]
        checks: list[str] = []
        for r, subjects in zip(requests, known):
            names = store._n(r.tenant)
            gen, expected = store._gen_guess(r.tenant)
            checks.append(expected)
            k = gen_keys(names.data(gen))
            e = escape(r.entity)
            calls += [("HGET", k.first, r.entity), ("HMGET", k.meta, "kt", "lag"),
                      ("MGET", names.gen, k.open_segment(e), *(k.segments + x for x in subjects))]
            if "r" in r.parts:
                calls.append(("SMEMBERS", k.incoming(e)))
        calls.append(("EXEC",))
        done = pipelined(client, calls)[-1]
        if not isinstance(done, list) or any(isinstance(x, Exception) for x in done):
            return None
        answers = iter(done)
        out: list[list[Any]] = []
        for r, subjects, expected in zip(requests, known, checks):
            first, meta, (gen, seg, *theirs) = next(answers), next(answers), next(answers)
            if expected and str(generation_of(gen)) != expected:
                return None
            elements = next(answers) if "r" in r.parts else []
            segments = dict(zip(subjects, theirs))
            if first is None:
                out.append([1])
                continue
            segs = []
            for el in elements:
                got = segments.get(_subject(el), False)
                if got is False:            # a subject new since the last view: VIEW reads it
                    return None
                segs.append(got or "")
            out.append([1, first, seg or "", elements, segs, meta])
        return out

    def _remember(self, requests: list[ViewRequest], results: list[list[Any]]) -> None:
        """The escaped subjects each view's elements name (the next view of the entity reads their open
        segments by MGET: `_with_mget`); emptied past SUBJECTS_KEPT subjects in all."""
        for r, result in zip(requests, results):
            if len(result) > 1 and "r" in r.parts:
                subjects = list(dict.fromkeys(map(_subject, result[3])))
                before = self._subjects.pop((r.tenant, r.entity), None)     # seen again: counted once
                if before is not None:
                    self._subjects_held -= len(before)
                if self._subjects_held + len(subjects) > SUBJECTS_KEPT:
                    self._subjects.clear()
                    self._subjects_held = 0
                self._subjects[(r.tenant, r.entity)] = subjects
                self._subjects_held += len(subjects)

    def _whole(self, tenant: str, entities: list[str]) -> dict[str, dict[str, Timeline]]:
        return {e: f.timelines for e, f in self.store._folds(tenant, entities).items()}

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
        its restatement serves; at other times `_past` reads the earlier closed segments around `at`."""
        asked: list[tuple[int, list[str]]] = []
        for i, (r, result) in enumerate(zip(requests, results)):
            if len(result) > 1 and int(result[1]) <= known_at:
                asked.append((i, list(dict.fromkeys([r.entity, *(_owner(el) for el in result[3]), ]))))
        if not asked:
            return {}
        used: list[str] = []

        def build(entities: list[str]) -> Any:
            def keys_and_args(d: str) -> tuple[list[str], list[Any]]:
                used.append(d)
                k = gen_keys(d)
                return [k.closed], [k.segments, k.known_indexes, known_at, *map(escape, entities)]
            return keys_and_args
        with self.store._guard("view", requests[0].tenant if len(requests) == 1 else None):
            answers = self.store._script_many(self._known_script, [(requests[i].tenant, build(es)) for i, es in asked])
        out: dict[int, dict[str, tuple[int, str] | None]] = {}
        for (i, entities), answer, d in zip(asked, answers, used[-len(asked):]):
            subs: dict[str, tuple[int, str] | None] = {}
            for e, got in zip(entities, answer[1]):
                if got == "*":
                    subs[e] = None
                elif got:
                    n, body = int(got[0]), got[1]
                    if not body:                # moved to the cold tier (cold.py)
                        got = self._cold(requests[i].tenant, d, escape(e), {n: body})
                        if got is None:         # a cut-over dropped it meanwhile: whole folds of the new generation
                            subs[e] = None
                            continue
                        body = got[n]
                    subs[e] = (n, body)
            out[i] = subs
        return out

    def _past(self, r: ViewRequest, own: Fold, elements: list[str], at: Micros, known_at: Micros | None,
              subs: dict[str, tuple[int, str] | None] | None = None, opened: tuple[str, Any] | None = None,
              ) -> dict[str, dict[str, Timeline]]:
        """The timelines a view at a past `at` reads: per entity (the viewed one, the subjects of relations naming
        it), from the closed segments the valid-time index names and the open segment, all read in one PAST call.
        An entity for which those do not answer exactly (overlapping ranges, a void, a relation's end among
        them) is read around `at` until its answer is (`_widened`), or else folded whole. `subs`
        (`_known_segments`): entities whose closed segment m stands in for the open one; their segments from m
        on are not read. `opened`: a segment of the viewed entity already decoded, and its blocks."""
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
        with self.store._guard("view", r.tenant):
            [result] = self.store._script_many(self._past_script, [(r.tenant, lambda d: (
                used.append(d), [], [gen_keys(d).segments, gen_keys(d).valid_indexes, t9, len(opens), *opens,
                                   *triples, segment_past.WINDOWS[0], segment_past.SCAN,
                                   "1" if known_at is None else ""])[1:])])
        _, verdicts, segments = result
        missing = [(x, int(n)) for x, got in zip(opens, segments) for n, seg in zip(got[1::2], got[2::2]) if not seg]
        if missing:                         # closed segments in the cold tier (cold.py)
            g = cold_tier.generation_of(used[-1])
            found = (cold_tier.fill(self.store, r.tenant, g, missing) if r.tenant in self.store._pins
                     else cold_tier.fill_current(self.store, r.tenant, g, missing))
            if found is None:               # a cut-over dropped them meanwhile: whole folds of the new generation
                return self._whole(r.tenant, entities)
            segments = [[got[0], *(x for n, seg in zip(got[1::2], got[2::2])
                                   for x in (n, seg or found[(e, int(n))]))] for e, got in zip(opens, segments)]
        out: dict[str, dict[str, Timeline]] = {}
        whole: list[str] = []
        lasts: dict[str, str] = {}
        closed: dict[str, dict[int, str]] = {}  # the closed segments PAST read, by entity and number
        answered: dict[str, list[Any]] = {}     # INDEX's answers PAST gave for the first window (WINDOWS[0])
        verdict = iter(verdicts)
        for e, got in zip(entities, segments):
            ps = wanted[e]
            answers = [next(verdict) for _ in ps]
            flagged = [bool(a) for a in answers]
            if any(flagged):
                answered[e] = answers
            sub = (subs or {}).get(e)
            if sub is None:
                chosen = [*got[2::2], got[0]]
            else:       # the index's choice counts writes not known then: read around `at` (_widened)
                chosen = [sub[1]]
                flagged.append(True)
            tls = None if any(flagged) else past_timelines(
                [*map(CLOSED.get, chosen[:-1]), _blocks(chosen[-1], opened)], ps, at, known_at)
            if tls is None:
                whole.append(e)
                lasts[e] = chosen[-1]
                closed[e] = {int(n): body for n, body in zip(got[1::2], got[2::2])}
            else:
                out[e] = tls
        if whole:
            near = self._widened(r.tenant, {e: wanted[e] for e in whole}, lasts, at, known_at, subs or {},
                                 (used[-1], answered), opened, closed)
            out.update(near)
            if len(near) < len(whole):
                out.update(self._whole(r.tenant, [e for e in whole if e not in near]))
        return out

    def _widened(self, tenant: str, wanted: dict[str, list[str]], lasts: dict[str, str], at: Micros,
                 known_at: Micros | None, subs: dict[str, tuple[int, str] | None],
                 given: tuple[str, dict[str, list[Any]]], opened: tuple[str, Any] | None = None,
                 closed: dict[str, dict[int, str]] | None = None) -> dict[str, dict[str, Timeline]]:
        """The wanted timelines of entities (P by entity) at `at`, read around it from the index entries INDEX
        returns and the closed segments SEGMENTS fetches, until exact (segment_past.py); `lasts`: each entity's
        open segment or the closed one standing in for it; `given`: a data prefix and, by entity, INDEX's answers
        for the first window, as PAST gave them (the other entities ask INDEX); `closed`: by entity, closed
        segments of that data prefix read already (PAST's guess), fetched no more. A window of index entries that
        runs out is asked again wider (segment_past.WINDOWS); the entities still not served are left out."""
        out: dict[str, dict[str, Timeline]] = {}
        t9 = clamped_point(at)
        for window in segment_past.WINDOWS:
            todo = {e: ps for e, ps in wanted.items() if e not in out}
            if not todo:
                break
            pre = given[1] if window == segment_past.WINDOWS[0] else {}
            asked = {e: ps for e, ps in todo.items() if e not in pre}
            byd: dict[str, str] = {e: given[0] for e in todo if e in pre}
            got: dict[str, Any] = {e: iter(pre[e]) for e in todo if e in pre}
            if asked:
                triples = [x for e, ps in asked.items() for p in ps for x in (escape(e), p, t9)]
                used: list[str] = []
                with self.store._guard("view", tenant):
                    [result] = self.store._script_many(self._index_script, [(tenant, lambda d, used=used, k=window,
                                                                              triples=triples: (
                        used.append(d), [], [gen_keys(d).valid_indexes, k, segment_past.SCAN, *triples])[1:])])
                answers = iter(result[1])
                for e, ps in asked.items():
                    byd[e] = used[-1]
                    got[e] = iter([next(answers) for _ in ps])
            for e, ps in todo.items():
                d = byd[e]
                sub = subs.get(e)
                memo: dict[Any, Any] = {}
                spans = {p: segment_past.spans_of(next(got[e]), p, t9, None if sub is None else sub[0], window,
                                                  memo) for p in ps}
                if any(span is None for span in spans.values()):
                    continue

                def fetch(numbers: list[int], e: str = e, d: str = d) -> dict[int, str] | None:
                    have = (closed or {}).get(e, {}) if d == given[0] else {}
                    rest = [n for n in numbers if n not in have]
                    got = self._closed_segments(tenant, d, e, rest) if rest else {}
                    return None if got is None else {**{n: have[n] for n in numbers if n in have}, **got}
                tls = segment_past.widened(spans, _blocks(lasts[e], opened), at, known_at, fetch)  # type: ignore[arg-type]
                if tls is not None:
                    out[e] = tls
        return out

    def _closed_segments(self, tenant: str, d: str, entity: str, numbers: list[int]) -> dict[int, str] | None:
        """Closed segments of an entity by number, of the generation whose data prefix is `d` (from Redis or the
        cold tier); None when the tenant switched generation meanwhile."""
        x = escape(entity)
        used: list[str] = []
        with self.store._guard("view", tenant):
            [result] = self.store._script_many(self._segments_script, [(tenant, lambda d: (
                used.append(d), [], [gen_keys(d).segments, x, *numbers])[1:])])
        if used[-1] != d:
            return None
        return self._cold(tenant, d, x, dict(zip(numbers, result[1])))

    def _cold(self, tenant: str, d: str, x: str, bodies: dict[int, str]) -> dict[int, str] | None:
        """Closed segments of the escaped entity `x` by number, those read "" (moved to the cold tier, cold.py)
        filled from it: from the generation `d` names when the store is pinned to it, else only while it is the
        tenant's current one (None: a cut-over dropped them meanwhile)."""
        missing = [(x, n) for n, body in bodies.items() if not body]
        if not missing:
            return bodies
        g = cold_tier.generation_of(d)
        found = (cold_tier.fill(self.store, tenant, g, missing) if tenant in self.store._pins
                 else cold_tier.fill_current(self.store, tenant, g, missing))
        if found is None:
            return None
        return {**bodies, **{n: found[(x, n)] for _, n in missing}}


def _blocks(segment: str, opened: tuple[str, Any] | None) -> list[list[Any]]:
    """A segment's blocks, those of `opened` (a segment and its blocks, decoded already) when it is that one."""
    return opened[1] if opened is not None and segment == opened[0] else decode(segment)


def _known_after(open_segment: str, known_at: Micros | None) -> bool:
    """Whether every delta of an open segment was recorded after `known_at`: then a closed segment can stand in
    for what was known (`ViewReader._known_segments`), which the closed ones' index alone cannot promise."""
    got = recorded_range(decode(open_segment))
    return known_at is not None and (got is None or got[0] > known_at)


def _owner(element: str) -> str:
    """The subject named by an element `>` + escaped subject + `|` + P of an entity's incoming relations."""
    return unescape(_subject(element))


def _subject(element: str) -> str:
    """The escaped subject of an element of an entity's incoming relations (`>` + escaped subject + `|` + P)."""
    return element[1:element.index("|")]


_PARSED: dict[tuple[str, str], tuple[Key, str]] = {}
_PARSED_MAX = 1 << 14          # (entity, text) pairs: a few MB


def _parsed(entity: str, text: str) -> tuple[Key, str]:
    """(the timeline key, P) of an element of an entity's incoming relations (`>` + escaped subject + `|` + P)
    or of a P of its own; memoized, as views read the same ones again (emptied past _PARSED_MAX)."""
    got = _PARSED.get((entity, text))
    if got is None:
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()
        got = _PARSED[(entity, text)] = (index_key(entity, text),
                                         text[text.index("|") + 1:] if text[0] == ">" else text)
    return got


def _keyed(r: ViewRequest, timelines: dict[str, dict[str, Timeline]], elements: list[str],
           ) -> tuple[list[Key], list[Key], dict[Key, Timeline]]:
    """(label and fact keys, relation keys, every timeline by key) a view of an entity reads, from its timelines
    and those of the subjects of relations naming it (by entity, then P)."""
    keyed: dict[Key, Timeline] = {_parsed(r.entity, p)[0]: tl for p, tl in timelines[r.entity].items()}
    for el in elements:
        key, p = _parsed(r.entity, el)
        tl = timelines.get(key[1], {}).get(p)
        if tl is not None:
            keyed[key] = tl
    point_keys, rel_keys = select_keys(keyed, r.scopes, r.parts)
    return point_keys, rel_keys, keyed


def _entity_view(entity: str, point_keys: list[Key], rel_keys: list[Key], keyed: dict[Key, Timeline], at: Micros,
                 known_at: Micros | None) -> EntityView:
    return entity_view(entity, ((k, keyed[k].as_of(at, known_at)) for k in point_keys),
                       ((k, covering(keyed[k].runs(known_at), at)) for k in rel_keys))


def _view(r: ViewRequest, timelines: dict[str, dict[str, Timeline]], elements: list[str], at: Micros,
          known_at: Micros | None) -> EntityView:
    """The view of one entity from its timelines and those of the subjects of relations naming it (by entity,
    then P)."""
    return _entity_view(r.entity, *_keyed(r, timelines, elements), at, known_at)
