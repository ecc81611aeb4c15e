"""The core knows no domain: keel/, workers/, tools_server/ and inspector/ never name a cartridge's word.

Self-contained: the word list is derived here from every cartridges/*/cartridge.yaml of this repository
(entity types, relation names, event types, rule names), and the checker is tested on a planted hit.
"""
from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("keel", "workers", "tools_server", "inspector")
SECTIONS = ("entities", "relations", "events", "rules")


def cartridge_words(root: Path = ROOT) -> set[str]:
    """Every name a cartridge declares in SECTIONS (longer than two characters)."""
    words: set[str] = set()
    for file in root.glob("cartridges/*/cartridge.yaml"):
        doc = yaml.safe_load(file.read_text()) or {}
        for section in SECTIONS:
            words.update((doc.get(section) or {}).keys())
    return {w for w in words if len(w) > 2}


def core_hits(root: Path, words: Iterable[str]) -> list[str]:
    """`path:line: word` for each quoted cartridge word in the layers' code (comment lines aside)."""
    patterns = [(w, re.compile(rf"""["']{re.escape(w)}["']""")) for w in sorted(words)]
    hits = []
    for folder in LAYERS:
        for file in sorted((root / folder).rglob("*.py")):
            for n, line in enumerate(file.read_text().splitlines(), 1):
                if line.strip().startswith("#"):
                    continue
                hits += [f"{file.relative_to(root)}:{n}: {w}" for w, p in patterns if p.search(line)]
    return hits


def test_the_word_list_covers_every_cartridge() -> None:
    files = sorted(ROOT.glob("cartridges/*/cartridge.yaml"))
    assert files, "no cartridge in the repository: nothing to derive the word list from"
    words = cartridge_words()
    for file in files:
        doc = yaml.safe_load(file.read_text()) or {}
        declared = {w for s in SECTIONS for w in (doc.get(s) or {}) if len(w) > 2}
        assert declared, f"{file} declares no entity, relation, event or rule"
        assert declared <= words


def test_core_names_no_cartridge_word() -> None:
    assert core_hits(ROOT, cartridge_words()) == []


def test_the_checker_finds_a_planted_word(tmp_path: Path) -> None:
    """The check must fail when a cartridge word appears in keel/: plant one in a copy and look."""
    word = min(cartridge_words())
    for folder in LAYERS:
        (tmp_path / folder).mkdir()
    (tmp_path / "keel" / "leak.py").write_text(f'# "{word}" in a comment is fine\nKIND = "{word}"\n')
    assert core_hits(tmp_path, cartridge_words()) == [f"keel/leak.py:2: {word}"]
