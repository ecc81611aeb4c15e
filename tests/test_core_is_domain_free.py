"""The core knows no domain: keel/, workers/ and tools_server/ never name a cartridge's word."""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def cartridge_words() -> set[str]:
    words: set[str] = set()
    for file in ROOT.glob("cartridges/*/cartridge.yaml"):
        doc = yaml.safe_load(file.read_text()) or {}
        for section in ("entities", "relations", "events", "rules"):
            words.update((doc.get(section) or {}).keys())
    return {w for w in words if len(w) > 2}


def test_core_names_no_cartridge_word() -> None:
    words = cartridge_words()
    assert {"debt", "vehicle", "client"} <= words
    hits = []
    for folder in ("keel", "workers", "tools_server"):
        for file in (ROOT / folder).rglob("*.py"):
            for n, line in enumerate(file.read_text().splitlines(), 1):
                if line.strip().startswith("#"):
                    continue
                for w in words:
                    if re.search(rf"""["']{re.escape(w)}["']""", line):
                        hits.append(f"{file.relative_to(ROOT)}:{n}: {w}")
    assert hits == []


def test_the_shared_checker_agrees_when_present() -> None:
    import subprocess
    import sys
    script = ROOT.parent / "shared" / "tools" / "core_words.py"
    if not script.exists():
        return
    done = subprocess.run([sys.executable, str(script), str(ROOT)], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout
