"""BM25 over a tenant's entities (ids, types, labels); rebuilt lazily when the tenant changes."""
from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable
from typing import Any

_WORD = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75


def tokens(text: str) -> list[str]:
    """Lowercase, accents folded, split on anything that is not a letter or digit."""
    folded = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode().lower()
    return _WORD.findall(folded)


def _label_text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return " ".join(_label_text(v) for v in value)
    if isinstance(value, dict):
        return " ".join(_label_text(v) for v in value.values())
    return str(value)


class BM25Index:
    """An immutable BM25 index over (entity, type, labels) documents."""

    def __init__(self, documents: Iterable[tuple[str, str, dict[str, Any]]]) -> None:
        self.docs: list[tuple[str, str, dict[str, Any]]] = []
        self.tfs: list[Counter[str]] = []
        self.lengths: list[int] = []
        self.df: Counter[str] = Counter()
        for entity, etype, labels in documents:
            words = tokens(entity.replace(":", " ")) + tokens(etype)
            for value in labels.values():
                words += tokens(_label_text(value))
            tf = Counter(words)
            self.docs.append((entity, etype, labels))
            self.tfs.append(tf)
            self.lengths.append(len(words))
            self.df.update(tf.keys())
        self.avg = (sum(self.lengths) / len(self.lengths)) if self.lengths else 0.0

    def search(self, query: str, *, type: str | None = None, limit: int = 10) -> list[dict[str, Any]]:
        terms = list(dict.fromkeys(tokens(query)))
        n = len(self.docs)
        if not terms or not n:
            return []
        idf = {t: math.log(1 + (n - self.df[t] + 0.5) / (self.df[t] + 0.5)) for t in terms if self.df[t]}
        scored = []
        for i, tf in enumerate(self.tfs):
            entity, etype, labels = self.docs[i]
            if type is not None and etype != type:
                continue
            score = 0.0
            norm = K1 * (1 - B + B * self.lengths[i] / self.avg) if self.avg else K1
            for t, w in idf.items():
                f = tf.get(t)
                if f:
                    score += w * f * (K1 + 1) / (f + norm)
            if score > 0:
                scored.append((-round(score, 6), entity, etype, labels))
        scored.sort(key=lambda r: (r[0], r[1]))
        return [{"entity": e, "type": t, "labels": labels, "score": -s} for s, e, t, labels in scored[:limit]]
