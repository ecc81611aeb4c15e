"""The all-Python twin of a cartridge whose event types use declarative `project:` steps (keel.projection)."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

PYTHON_HANDLERS = Path(__file__).resolve().parents[1] / "data" / "python_handlers"


def python_twin(folder: Path, tmp: Path, handlers_of: str | None = None) -> Path:
    """A copy of a cartridge folder with every `project:` removed and, appended to its handlers.py, the Python
    handlers those steps replaced (tests/data/python_handlers/<handlers_of or the folder's name>.py)."""
    twin = tmp / f"{folder.name}-python"
    shutil.copytree(folder, twin)
    doc = yaml.safe_load((folder / "cartridge.yaml").read_text())
    for event in doc["events"].values():
        event.pop("project", None)
    (twin / "cartridge.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    own = folder / "handlers.py"
    head = own.read_text() if own.exists() else "from keel import Registry\n\nregistry = Registry()\n"
    (twin / "handlers.py").write_text(
        head + "\n\n" + (PYTHON_HANDLERS / f"{handlers_of or folder.name}.py").read_text())
    return twin
