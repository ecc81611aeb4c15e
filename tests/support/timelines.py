"""Generated timelines for the property tests of keel/timeline.py's rules: values, ends, voids, expiring
notes and corrections at shared points, with recorded times that may go back (late data)."""
from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from keel.timeline import Assertion, new_assertion, void_of

POINTS = 12

assertion_strategy = st.tuples(st.integers(0, POINTS), st.sampled_from(["v", "v", "v", "end", "void", "note"]),
                               st.integers(0, 2), st.integers(1, 4), st.integers(0, 6))


def assertion(i: int, spec: tuple[Any, ...]) -> Assertion:
    point, kind, value, expires, late = spec
    recorded = 100 + i - late
    if kind == "end":
        return new_assertion(point, None, True, f"s{i}", f"e{i}", recorded)
    if kind == "void":
        return new_assertion(point, void_of(f"e{max(0, i - 1)}"), True, f"s{i}", f"e{i}", recorded)
    return new_assertion(point, value, False, f"s{i}", f"e{i}", recorded,
                         expires_at=point + expires if kind == "note" else None)
