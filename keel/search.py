"""Search over a tenant's entities: ids, types, labels and notes, at any world time as known at any time.

Tokens (`tokens`, `query_tokens`): any script. Words are case-folded (NFKC + casefold) and, for Latin
letters, accent-folded (José = jose); runs of scripts written without spaces between words (Han, kana,
Thai, Lao, Khmer, Myanmar) are indexed as their overlapping character bigrams and single characters, so any
two consecutive characters of a name match it (李小龙 is found by 小龙). Script classes come from the
`regex` module's Unicode Script_Extensions properties (maintained with Unicode) rather than from code
point ranges written here.

The index holds *segments*: the text of one version of a label or a note, with the rectangle of world
time × knowledge time in which that version is what the graph shows (derived with keel.timeline's fold,
so it agrees with `context`), and for notes the scope key that decides who may see them. A query keeps the
segments visible at (at, known_at) to the caller's scopes and ranks entities by BM25 over them.

Hybrid ranking: beside BM25 (the lexical signal, whose query words a cartridge's synonyms widen), the same
visible segments, the entity's id and its type's description give a semantic signal (keel.semantic: the cosine
of the query's vector and each segment's, an entity's best segment counting, at or above SEMANTIC_FLOOR). The
two rankings are fused by weighted reciprocal rank (RRF); each hit says which signal found it (`found_by`).
Vectors depend on text only and are kept by the index (and reused by the next build), so equal graphs give
equal rankings.
"""
from __future__ import annotations

import heapq
import json
import math
import unicodedata
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

import regex

from .store.base import REF_LABEL, Key
from .timeline import Assertion, Timeline
from .times import Micros

K1, B = 1.2, 0.75
RRF_K = 60                 # reciprocal rank fusion: a hit at rank r of a signal adds weight / (RRF_K + r)
LEXICAL_WEIGHT, SEMANTIC_WEIGHT = 1.0, 0.8   # measured on bench/search_quality.py's labelled queries
SEMANTIC_FLOOR = 0.3       # the least cosine a semantic hit needs (below it, unrelated words are as near)
DESCRIPTION_WEIGHT = 0.5   # the type's description in a segment's vector, beside the segment's own text
FUSION_DEPTH = 50          # each signal's ranking is fused down to this rank (or the limit, when larger)
NEVER = 1 << 62            # an open end of an interval (valid_to None, not superseded)
_UNSEGMENTED = (r"\p{scx=Han}\p{scx=Hiragana}\p{scx=Katakana}\p{scx=Thai}\p{scx=Lao}\p{scx=Khmer}"
                r"\p{scx=Myanmar}")
_RUNS = regex.compile(rf"(?P<u>[{_UNSEGMENTED}]+)|(?P<w>[[\p{{L}}\p{{M}}\p{{N}}]--[{_UNSEGMENTED}]]+)", regex.V1)
_LATIN_MARKS = regex.compile(r"(?<=\p{Latin})\p{Mn}+")
_LATIN_EXTRA = str.maketrans({"ø": "o", "đ": "d", "ł": "l", "æ": "ae", "œ": "oe", "ı": "i", "ŧ": "t", "ħ": "h"})


def _fold(word: str) -> str:
    """Latin accents off (NFKD, combining marks after a Latin letter dropped, NFC again)."""
    if word.isascii():
        return word
    stripped = _LATIN_MARKS.sub("", unicodedata.normalize("NFKD", word))
    return unicodedata.normalize("NFC", stripped).translate(_LATIN_EXTRA)


def _runs(text: str) -> Iterator[tuple[bool, str]]:
    for m in _RUNS.finditer(unicodedata.normalize("NFKC", text).casefold()):
        unsegmented = m.group("u")
        yield (True, unsegmented) if unsegmented else (False, _fold(m.group("w")))


def tokens(text: str) -> list[str]:
    """Index tokens: folded words; for unsegmented runs every bigram and every character."""
    out: list[str] = []
    for unsegmented, run in _runs(text):
        if unsegmented:
            out += [run[i:i + 2] for i in range(len(run) - 1)]
            out += list(run)
        else:
            out.append(run)
    return out


def query_tokens(text: str) -> list[str]:
    """Query tokens: folded words; unsegmented runs as their bigrams (one character alone as itself)."""
    out: list[str] = []
    for unsegmented, run in _runs(text):
        if unsegmented and len(run) > 1:
            out += [run[i:i + 2] for i in range(len(run) - 1)]
        else:
            out.append(run)
    return list(dict.fromkeys(out))


def value_text(value: Any) -> str:
    """The searchable text of a JSON value (strings of lists and objects joined)."""
    if isinstance(value, (list, tuple)):
        return " ".join(value_text(v) for v in value)
    if isinstance(value, dict):
        return " ".join(value_text(v) for v in value.values())
    return "" if value is None else str(value)


class Rectangle(NamedTuple):
    """A value shown for valid times [valid_from, valid_to) by every knowledge time in [known_from, known_to)."""
    value: Any
    valid_from: Micros
    valid_to: Micros
    known_from: Micros
    known_to: Micros


def rectangles(assertions: Iterable[Assertion]) -> list[Rectangle]:
    """Every version of a timeline with the knowledge interval in which it was believed (keel.timeline's fold
    at each distinct recorded_at, equal versions of consecutive knowledge times merged)."""
    tl = Timeline.over(list(assertions))         # by point, then log order, as every store gives them
    out: list[Rectangle] = []
    open_: dict[tuple[str, Micros, Micros], Rectangle] = {}
    for known in sorted({a.recorded_at for a in tl.assertions()}):
        seen = set()
        for v in tl.versions(known):
            end = NEVER if v.valid_to is None else v.valid_to
            key = (json.dumps(v.assertion.value, sort_keys=True), v.assertion.point, end)
            seen.add(key)
            if key not in open_:
                open_[key] = Rectangle(v.assertion.value, v.assertion.point, end, known, NEVER)
        for key in [k for k in open_ if k not in seen]:
            out.append(open_.pop(key)._replace(known_to=known))
    return out + list(open_.values())


SearchEntity = tuple[str, Micros, list[tuple[Key, list[Assertion]]]]   # (entity, first recorded_at, timelines)


class SearchOptions(NamedTuple):
    """What a cartridge says about its search (`search:` of cartridge.yaml, docs/cartridges.md)."""
    semantic: bool = True                              # false: BM25 alone, the model never loaded
    synonyms: tuple[tuple[str, ...], ...] = ()         # groups of words or phrases the lexical side treats alike
    descriptions: tuple[tuple[str, str], ...] = ()     # (entity type, its description)


def meaning_text(text: str) -> str:
    """The text the semantic side embeds: its words without those holding a digit (numbers, dates, plates and
    counters carry no meaning the model knows, and leaving them out lets "Visa 17" and "Visa 18" share a row)."""
    return " ".join(w for w in text.split() if not any(c.isdigit() for c in w))


class SearchIndex:
    """An immutable BM25 index over segments (id, label versions, note versions), with postings lists so a
    query looks only at segments containing one of its words."""

    def __init__(self, entities: Iterable[SearchEntity], options: SearchOptions | None = None,
                 previous: SearchIndex | None = None) -> None:
        self.options = options = options or SearchOptions()
        self.synonyms = [[tuple(query_tokens(m)) for m in group] for group in options.synonyms]
        self.names: list[str] = []
        self.first: list[Micros] = []
        self.segments: list[list[int]] = []          # entity -> its label and note segments
        self.starts: list[list[int]] = []            # entity -> segments of its labels (existence)
        self.id_length: list[int] = []
        self.settled: list[tuple[Micros, Micros, int] | None] = []   # see _settled
        # per segment: entity, scope key ("" for labels), rectangle, label name (None for notes), length
        self.s_entity: list[int] = []
        self.s_scope: list[str] = []
        self.s_rect: list[Rectangle] = []
        self.s_label: list[str | None] = []
        self.s_length: list[int] = []
        self.postings: dict[str, list[tuple[int, int]]] = {}   # term -> (segment, tf); segment -1-e: entity e's id
        rows: dict[tuple[str, str], int] = {}          # (entity type, text) -> its row of the semantic matrix
        self.row_owners: list[list[int]] = []            # row -> segments (-1-e: entity e's id) with that text
        self.rows_of: list[list[tuple[int, int]]] = []   # entity -> its (segment, row) pairs
        total = 0
        changes: list[tuple[Micros, int, int]] = []   # (knowledge time, entities, words) the corpus gains or loses
        for e, (entity, first, timelines) in enumerate(entities):
            self.names.append(entity)
            self.first.append(first)
            segs: list[int] = []
            starts: list[int] = []
            words = tokens(entity.replace(":", " "))
            self.id_length.append(len(words))
            changes.append((first, 1, len(words)))
            self._post(words, -1 - e)
            kind_of = entity.partition(":")[0]
            self.rows_of.append([])
            if options.semantic:
                self._row(rows, kind_of, meaning_text(" ".join(regex.split(r"[:_\-.]+", entity))), -1 - e)
            current = len(words)
            for key, assertions in timelines:
                kind = key[0]
                if kind not in "lef" or (kind == "f" and not key[3]):
                    continue                  # relations and domain facts are not searched
                label = key[2] if kind == "l" else "" if kind == "e" else None
                for rect in rectangles(assertions):
                    s = len(self.s_entity)
                    text = value_text(rect.value) if kind == "f" or label not in ("", REF_LABEL) else ""
                    seg_words = tokens(text)
                    self.s_entity.append(e)
                    self.s_scope.append(key[3] if kind == "f" else "")
                    self.s_rect.append(rect)
                    self.s_label.append(label)
                    self.s_length.append(len(seg_words))
                    self._post(seg_words, s)
                    meaning = meaning_text(text) if options.semantic else ""
                    if any(c.isalpha() for c in meaning):
                        self._row(rows, kind_of, meaning, s)
                    (starts if kind != "f" else segs).append(s)
                    if rect.valid_to == NEVER:             # the open version, as known from known_from on
                        changes.append((rect.known_from, 0, len(seg_words)))
                        if rect.known_to != NEVER:
                            changes.append((rect.known_to, 0, -len(seg_words)))
                        else:
                            current += len(seg_words)
            self.segments.append(segs + starts)
            self.starts.append(starts)
            self.settled.append(self._settled(segs, starts, current))
            total += current
        self.avg = (total / len(self.names) if self.names else 0.0) or 1.0
        self._vectors(rows, previous)
        # The corpus statistics BM25 needs, as known at any time: a question asked again later as known at the
        # same time scores the same (an audited answer is reproduced byte for byte), whatever was learnt since.
        changes.sort()
        self.stat_times: list[Micros] = []
        self.stat_counts: list[tuple[int, int]] = []  # (entities, words) known up to and including stat_times[i]
        entities_known = words_known = 0
        for when, de, dw in changes:
            entities_known += de
            words_known += dw
            if self.stat_times and self.stat_times[-1] == when:
                self.stat_counts[-1] = (entities_known, words_known)
            else:
                self.stat_times.append(when)
                self.stat_counts.append((entities_known, words_known))

    def _row(self, rows: dict[tuple[str, str], int], kind: str, text: str, segment: int) -> None:
        row = rows.setdefault((kind, text), len(rows))
        if row == len(self.row_owners):
            self.row_owners.append([])
        self.row_owners[row].append(segment)
        self.rows_of[-1].append((segment, row))

    def _vectors(self, rows: dict[tuple[str, str], int], previous: SearchIndex | None) -> None:
        """The semantic side: `matrix`, a unit vector per distinct text (segments' texts, ids, the types'
        descriptions), and per row (type, text) the text's row, the type's description's row (-1: none) and
        the scale that makes text + DESCRIPTION_WEIGHT x description a unit vector. A query's cosines are then
        one product with `matrix` and a gather. Texts the previous index embedded are taken from it."""
        self.text_rows: dict[str, int] = {}
        self.matrix: Any = None
        if not rows:
            return
        # numpy, like the model, is loaded by the first search by meaning: a process that never makes one (a worker,
        # `keel --help`) does not pay its import (~55 ms)
        import numpy as np

        from . import semantic
        descriptions = {k: d for k, d in self.options.descriptions if d}
        texts = list(dict.fromkeys([t for _, t in rows] + list(descriptions.values())))
        self.text_rows = {t: i for i, t in enumerate(texts)}
        matrix = np.empty((len(texts), semantic.DIM), dtype=np.float32)
        known = previous.text_rows if previous is not None and previous.matrix is not None else {}
        for i, t in enumerate(texts):
            j = known.get(t)
            matrix[i] = previous.matrix[j] if j is not None else semantic.embed(t)    # type: ignore[union-attr]
        self.matrix = matrix
        self.row_text = np.fromiter((self.text_rows[t] for _, t in rows), dtype=np.int32, count=len(rows))
        self.row_description = np.fromiter((self.text_rows[descriptions[k]] if k in descriptions else -1
                                            for k, _ in rows), dtype=np.int32, count=len(rows))
        mixed = matrix[self.row_text] + DESCRIPTION_WEIGHT * np.where(
            (self.row_description >= 0)[:, None], matrix[self.row_description], 0)
        norms = np.linalg.norm(mixed, axis=1)
        self.row_scale = np.where(norms > 0, 1 / np.where(norms > 0, norms, 1), 0).astype(np.float32)

    def _cosines(self, q: Any) -> Any:
        """Each row's cosine with the unit query vector `q`, rounded to 6 places (ties compare equal whatever
        the BLAS kernel)."""
        import numpy as np
        per_text = self.matrix @ q
        description = np.where(self.row_description >= 0, per_text[self.row_description], 0)
        return np.round((per_text[self.row_text] + DESCRIPTION_WEIGHT * description) * self.row_scale, 6)

    def corpus(self, known: Micros) -> tuple[int, float]:
        """(entities known, their average length in words) as known at `known` (the open versions of labels
        and notes, and ids); the whole index's figures when `known` is after everything."""
        i = bisect_right(self.stat_times, known) - 1
        if i < 0:
            return 0, 1.0
        n, words = self.stat_counts[i]
        return n, (words / n if n else 0.0) or 1.0

    def _settled(self, notes: list[int], starts: list[int], length: int) -> tuple[Micros, Micros, int] | None:
        """(world, knowledge, length) when an entity has no notes and only label versions that never end nor
        were replaced: from that world and knowledge time on, all of it is visible (the common case, checked
        without looking at its segments)."""
        if notes or any(self.s_rect[s].valid_to != NEVER or self.s_rect[s].known_to != NEVER for s in starts):
            return None
        return (max((self.s_rect[s].valid_from for s in starts), default=-NEVER),
                max((self.s_rect[s].known_from for s in starts), default=-NEVER), length)

    def _post(self, words: list[str], segment: int) -> None:
        counts: dict[str, int] = {}
        for w in words:
            counts[w] = counts.get(w, 0) + 1
        for term, tf in counts.items():
            self.postings.setdefault(term, []).append((segment, tf))

    def _visible(self, s: int, at: Micros, known: Micros, scopes: frozenset[str]) -> bool:
        r = self.s_rect[s]
        return (r.valid_from <= at < r.valid_to and r.known_from <= known < r.known_to
                and self.s_scope[s] in scopes)

    def _exists(self, e: int, at: Micros, known: Micros) -> bool:
        """Known by `known`, and begun by `at` (a label version valid at or before it), when it has labels."""
        if self.first[e] > known:
            return False
        starts = self.starts[e]
        if not starts:
            return True
        return any(self.s_rect[s].valid_from <= at and self.s_rect[s].known_from <= known < self.s_rect[s].known_to
                   for s in starts)

    def search(self, query: str, *, at: Micros, known_at: Micros | None, scopes: Iterable[str],
               type: str | None = None, limit: int = 10) -> list[dict[str, Any]]:
        """Entities matching the query in the text visible at `at` as known at `known_at` to `scopes` (scope
        keys, "" = labels), best first: BM25 and, unless the cartridge turned it off, the semantic signal,
        fused by reciprocal rank."""
        known = NEVER - 1 if known_at is None else known_at
        allowed = frozenset(scopes) | {""}
        status: dict[int, int] = {}       # entity -> 0 not shown, 1 shown in part, 2 shown whole (settled)
        depth = max(limit, FUSION_DEPTH)
        names = self.names
        lexical = heapq.nsmallest(depth, ((-score, names[e], e) for e, score in
                                          self._lexical(query, at, known, allowed, type, status).items()))
        meaning = self._semantic(query, at, known, allowed, type, status, depth, [e for _, _, e in lexical])
        fused: dict[int, float] = {}
        found: dict[int, str] = {}
        for rank, (_, _, e) in enumerate(lexical, 1):
            fused[e] = LEXICAL_WEIGHT / (RRF_K + rank)
            found[e] = "lexical"
        for rank, (_, _, e) in enumerate(meaning, 1):
            fused[e] = fused.get(e, 0.0) + SEMANTIC_WEIGHT / (RRF_K + rank)
            found[e] = "both" if e in found else "semantic"
        ranked = heapq.nsmallest(limit, ((-round(score, 9), names[e], e) for e, score in fused.items()))
        return [{"entity": name, "type": name.partition(":")[0], "labels": self._labels(e, at, known),
                 "score": round(-score, 6), "found_by": found[e]} for score, name, e in ranked]

    def expand(self, query: str) -> list[str]:
        """The query's tokens, and those of every synonym of a word or phrase it holds (the cartridge's
        `search.synonyms`: a group's member is held when all its tokens are the query's)."""
        words = query_tokens(query)
        held = set(words)
        for group in self.synonyms:
            if any(member and held.issuperset(member) for member in group):
                words += [t for member in group for t in member]
        return list(dict.fromkeys(words))

    def _lexical(self, query: str, at: Micros, known: Micros, allowed: frozenset[str], type: str | None,
                 status: dict[int, int]) -> dict[int, float]:
        """BM25 score of every entity holding one of the query's words (synonyms too) where it is visible."""
        per_term: list[dict[int, int]] = []
        for term in self.expand(query):
            tfs: dict[int, int] = {}
            for s, tf in self.postings.get(term, ()):
                e = -1 - s if s < 0 else self.s_entity[s]
                state = status.get(e)
                if state is None:
                    state = status[e] = self._status(e, at, known, type)
                if state == 2 or (state == 1 and (s < 0 or self._visible(s, at, known, allowed))):
                    tfs[e] = tfs.get(e, 0) + tf
            per_term.append(tfs)
        n, avg = self.corpus(known)
        norms: dict[int, float] = {}
        scores: dict[int, float] = {}
        for tfs in per_term:
            idf = math.log(1 + (n - len(tfs) + 0.5) / (len(tfs) + 0.5))
            for e, tf in tfs.items():
                norm = norms.get(e)
                if norm is None:
                    norm = norms[e] = K1 * (1 - B + B * self._length(e, status[e], at, known, allowed) / avg)
                scores[e] = scores.get(e, 0.0) + idf * tf * (K1 + 1) / (tf + norm)
        return scores

    def _semantic(self, query: str, at: Micros, known: Micros, allowed: frozenset[str], type: str | None,
                  status: dict[int, int], depth: int, found: list[int]) -> list[tuple[float, str, int]]:
        """The semantic ranking: up to `depth` entities by their best visible segment's cosine with the query
        (at least SEMANTIC_FLOOR), best first, as (-cosine, name, entity), ties by id. The entities the words
        found (`found`) are ranked with their cosine; one they did not find joins only when it is nearer in
        meaning than every one they found (so a query whose words hit is not diluted by neighbours, and one
        whose words miss, or hit only a common word, still finds what it means)."""
        if self.matrix is None:
            return []
        import numpy as np

        from . import semantic
        q = semantic.embed(meaning_text(query))
        if not q.any():
            return []
        cosines = self._cosines(q)
        best: dict[int, float] = {}
        for e in found:
            near = [float(cosines[row]) for s, row in self.rows_of[e]
                    if status[e] == 2 or s < 0 or self._visible(s, at, known, allowed)]
            if near and max(near) >= SEMANTIC_FLOOR:
                best[e] = max(near)
        bar = max(best.values(), default=-1.0)
        rows = np.flatnonzero(cosines >= SEMANTIC_FLOOR)
        rows = rows[np.lexsort((rows, -cosines[rows]))]
        others = 0
        for row in rows.tolist():
            cosine = float(cosines[row])
            if cosine <= bar or others >= depth:
                break
            for s in self.row_owners[row]:
                e = -1 - s if s < 0 else self.s_entity[s]
                if e in best:
                    continue
                if others >= depth:
                    break
                state = status.get(e)
                if state is None:
                    state = status[e] = self._status(e, at, known, type)
                if state == 2 or (state == 1 and (s < 0 or self._visible(s, at, known, allowed))):
                    best[e] = cosine
                    others += 1
        names = self.names
        return heapq.nsmallest(depth, ((-c, names[e], e) for e, c in best.items()))

    def _status(self, e: int, at: Micros, known: Micros, type: str | None) -> int:
        if type is not None and not self.names[e].startswith(type + ":"):
            return 0
        fixed = self.settled[e]
        if fixed is not None and at >= fixed[0] and known >= fixed[1] and self.first[e] <= known:
            return 2
        return 1 if self._exists(e, at, known) else 0

    def _length(self, e: int, state: int, at: Micros, known: Micros, allowed: frozenset[str]) -> int:
        if state == 2:
            return self.settled[e][2]           # type: ignore[index]
        return self.id_length[e] + sum(self.s_length[s] for s in self.segments[e]
                                       if self._visible(s, at, known, allowed))

    def _labels(self, e: int, at: Micros, known: Micros) -> dict[str, Any]:
        labels = {self.s_label[s]: self.s_rect[s].value for s in self.starts[e]
                  if self.s_label[s] not in ("", REF_LABEL) and self._visible(s, at, known, frozenset(("",)))}
        return dict(sorted(labels.items()))
