"""The semantic signal of `search`: a small static embedding model shipped inside a pinned package.

The model is WordLlama's `l2_supercat` at 256 dimensions (the `wordllama` package, pinned exactly in
pyproject.toml): token embeddings averaged over a text, no network and no hub. Its weights and tokenizer are
files of the installed package; they are loaded from there with downloads disabled, so a missing file is an
error, never a download. A text's vector depends on the text only (each text is embedded alone, so no batch
padding or summation order enters it), which makes equal graphs give equal rankings.

It is a signal blended with BM25 (keel/search.py), not a source of facts: it says which words are near in
meaning, and is wrong often enough that it never ranks alone (docs/semantics.md, "Search").
"""
from __future__ import annotations

import hashlib
import threading
import unicodedata
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

from .errors import KeelError

MODEL = "wordllama"
CONFIG = "l2_supercat"
DIM = 256
Vector = Any          # a float32 array of DIM, unit length (or zero)


class ModelUnavailable(KeelError):
    """The pinned embedding model's files are not in the installed package (a broken install: Keel never
    downloads them)."""


_lock = threading.Lock()


@lru_cache(maxsize=1)
def _model() -> Any:
    """The WordLlama model, from the package folder only (0.4.0.post1 looks for its tokenizer under
    `tokenizer/` when asked without `cache_dir`, and would try Hugging Face; the wheel has `tokenizers/`)."""
    with _lock:
        # One BLAS thread in this process: a query's product (rows x 256 by 256) is too small to share, and
        # idle BLAS threads spin between queries, burning CPU that the readers beside them need.
        threadpool_limits(limits=1, user_api="blas")
        import wordllama  # a dependency of keel (pyproject.toml): imported only when search needs it
        try:
            return wordllama.WordLlama.load(config=CONFIG, dim=DIM, cache_dir=Path(wordllama.__file__).parent,
                                            disable_download=True)
        except FileNotFoundError as e:
            raise ModelUnavailable(f"the search model {MODEL} {CONFIG}-{DIM} cannot be loaded from its package "
                                   f"({type(e).__name__}); reinstall keel's dependencies") from e


def _files() -> list[Path]:
    import wordllama
    root = Path(wordllama.__file__).parent
    return [root / "weights" / f"{CONFIG}_{DIM}.safetensors",
            root / "tokenizers" / f"{CONFIG}_tokenizer_config.json"]


@lru_cache(maxsize=1)
def identity() -> str:
    """`wordllama <version> l2_supercat-256 sha256:<hex>` (the hash of its weights and tokenizer files): what
    `keel digest --search-model` prints after the graph's digest, so a changed model is visible."""
    try:
        version = metadata.version(MODEL)
        h = hashlib.sha256()
        for path in _files():
            h.update(path.name.encode() + b"\n")
            h.update(path.read_bytes())
    except (metadata.PackageNotFoundError, OSError) as e:
        raise ModelUnavailable(f"the search model {MODEL} is not installed ({type(e).__name__})") from e
    return f"{MODEL} {version} {CONFIG}-{DIM} sha256:{h.hexdigest()[:16]}"


def embed(text: str) -> Vector:
    """The unit vector of one text, case-folded as the lexical side folds it (NFKC, casefold: Visa = visa);
    zero when it has no token the model knows."""
    v = np.asarray(_model().embed([unicodedata.normalize("NFKC", text).casefold()])[0], dtype=np.float32)
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v
