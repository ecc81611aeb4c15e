"""The search Keel shipped before issue 13, kept only as the baseline of bench/search.py: BM25 over entity
ids, types and the latest labels, ASCII-only tokens (anything else dropped), no notes, no time."""
from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterator
from typing import Any

from keel.store.base import REF_LABEL, Store, entities_of

_WORD = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75


def tokens(text: str) -> list[str]:
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return _WORD.findall(folded)


def _label_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(_label_text(v) for v in value)
    if isinstance(value, dict):
        return " ".join(_label_text(v) for v in value.values())
    return str(value)


def documents(store: Store, tenant: str) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(entity, type, latest labels): the old Store.search_documents."""
    by_entity: dict[str, dict[str, Any]] = {}
    for key, assertions in store.dump(tenant):
        if key[0] != "l" or key[2] == REF_LABEL:
            for e in entities_of(key):
                by_entity.setdefault(e, {})
            continue
        labels = by_entity.setdefault(key[1], {})
        last_point = assertions[-1].point
        winner = [a for a in assertions if a.point == last_point][-1]
        if not winner.closed:
            labels[key[2]] = winner.value
    for entity in sorted(by_entity):
        yield entity, entity.partition(":")[0], by_entity[entity]


class LegacyIndex:
    def __init__(self, docs: Iterator[tuple[str, str, dict[str, Any]]]) -> None:
        self.docs: list[tuple[str, str, dict[str, Any]]] = []
        self.lengths: list[int] = []
        self.postings: dict[str, list[tuple[int, int]]] = {}
        for i, (entity, etype, labels) in enumerate(docs):
            words = tokens(entity.replace(":", " ")) + tokens(etype)
            for value in labels.values():
                words += tokens(_label_text(value))
            self.docs.append((entity, etype, labels))
            self.lengths.append(len(words))
            for term, tf in Counter(words).items():
                self.postings.setdefault(term, []).append((i, tf))
        self.avg = (sum(self.lengths) / len(self.lengths)) if self.lengths else 0.0

    def search(self, query: str, *, type: str | None = None, limit: int = 10) -> list[dict[str, Any]]:
        terms = list(dict.fromkeys(tokens(query)))
        n = len(self.docs)
        if not terms or not n:
            return []
        scores: dict[int, float] = {}
        for term in terms:
            posting = self.postings.get(term)
            if not posting:
                continue
            df = len(posting)
            idf = math.log(1 + (n - df + 0.5) / (df + 0.5))
            for i, tf in posting:
                norm = K1 * (1 - B + B * self.lengths[i] / self.avg) if self.avg else K1
                scores[i] = scores.get(i, 0.0) + idf * tf * (K1 + 1) / (tf + norm)
        ranked = sorted((-round(score, 6), self.docs[i][0], i) for i, score in scores.items()
                        if score > 0 and (type is None or self.docs[i][1] == type))
        return [{"entity": self.docs[i][0], "type": self.docs[i][1], "labels": self.docs[i][2], "score": -s}
                for s, _, i in ranked[:limit]]
