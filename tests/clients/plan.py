"""The driver scripts' side of tests/support/agent_clients.py (standard library only: each driver runs in its own
client's environment): read the plan from stdin, print one JSON document on stdout."""
from __future__ import annotations

import json
import sys
from typing import Any


def read_plan() -> dict[str, Any]:
    """{"transport": "stdio"|"http", "command"/"args"/"cwd" or "url"/"token", "calls": [{"tool", "arguments"}]}"""
    return json.load(sys.stdin)


def answer_ok(value: Any) -> dict[str, Any]:
    return {"ok": True, "value": value}


def answer_error(text: str) -> dict[str, Any]:
    return {"ok": False, "error": text}


def emit(document: dict[str, Any]) -> None:
    json.dump(document, sys.stdout, ensure_ascii=False)
    sys.stdout.write("\n")
    sys.stdout.flush()
