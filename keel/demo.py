"""`keel demo`: build a cartridge's sample stream in memory and run the story in its demo.py.

The story belongs to the cartridge (the core knows no domain); the core supplies the graph, the tools
and a scratch copy of the events file, so the demo's own notes never touch the sample stream.
"""
from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path
from typing import TextIO

from .cartridge import load_cartridge
from .connect import reveal_of, warn_clear
from .embedded import build_embedded
from .errors import UsageError
from .eventlog import FileLog


def run_demo(folder: Path, out: TextIO) -> int:
    cartridge = load_cartridge(folder)
    story = folder / "demo.py"
    if not story.is_file():
        raise UsageError(f"{folder} has no demo.py (a cartridge's demo defines run(ctx))")
    spec = importlib.util.spec_from_file_location(f"keel_demo_{cartridge.name}", story)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    with tempfile.TemporaryDirectory(prefix="keel-demo-") as tmp:
        events = Path(tmp) / "events.jsonl"
        shutil.copyfile(folder / "events.jsonl", events)
        if cartridge.spec.personal:     # the sample is in clear (a demo has no key file): read as --clear reads it
            warn_clear([cartridge], cause="keel demo reads its sample as --clear does")
        projector, report = build_embedded(cartridge, events, reveal=reveal_of(cartridge, None, clear=True))
        ctx = DemoContext(cartridge, projector, events, out, report.applied)
        module.run(ctx)
    return 0


class DemoContext:
    """What a cartridge's demo gets: the cartridge, the store, a way to make Tools, and `say`."""

    def __init__(self, cartridge, projector, events: Path, out: TextIO, applied: int) -> None:
        self.cartridge = cartridge
        self.store = projector.store
        self.events = events
        self.applied = applied
        self._projector = projector
        self._out = out

    def tools(self, tenant: str, *, agent: str | None = None, task: str | None = None):
        from .tools import Tools
        return Tools(self.cartridge, self.store, tenant, agent=agent, task=task,
                     log=FileLog(self._projector, self.events))

    def say(self, text: str = "") -> None:
        print(text, file=self._out)
