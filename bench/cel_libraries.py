"""The two CEL libraries on PyPI side by side, for Keel's rule verdicts (`when:`; see keel/rules.py).

    .venv/bin/python bench/cel_libraries.py          # needs `pip install cel-python` (not a Keel dependency)

Prints, per library: compile time per rule, evaluation time per rule (a compiled program, a fresh
activation each call, as `context` does), and whether each semantic case Keel relies on gives the
expected answer. Values are given as Keel gives them: JSON numbers as doubles, date strings as timestamps.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

RULES = [
    "facts.rate_ea_pct > params.rate_ea_pct",
    "facts.status == 'pending' && at >= labels.due_on + duration('24h')",
    "facts.odometer_km > facts.next_service_km + params.grace_km",
    "at - labels.last_visit_on > duration(string(int(params.days) * 24) + 'h')",
]
AT = datetime(2026, 11, 6, tzinfo=UTC)
VARS: dict[str, Any] = {
    "facts": {"rate_ea_pct": 29.22, "status": "pending", "odometer_km": 41000.0, "next_service_km": 40000.0},
    "labels": {"due_on": datetime(2026, 11, 5, tzinfo=UTC), "last_visit_on": datetime(2026, 6, 1, tzinfo=UTC)},
    "params": {"rate_ea_pct": 25.0, "grace_km": 0.0, "days": 90.0},
    "at": AT,
}
# (expression, expected): a value, or "error" for an evaluation that must fail (Keel turns it into null).
CASES: list[tuple[str, Any]] = [
    ("4.0 > 20", False),                                   # one number type: a comparison across int/double
    ("facts.rate_ea_pct > params.rate_ea_pct", True),
    ("params.rate_ea_pct == 25", True),                    # 25.0 == 25: heterogeneous equality
    ("at > labels.due_on", True),                          # dates compared in time order
    ("at >= labels.due_on + duration('24h')", True),
    ("labels.due_on < timestamp('2026-11-05T00:00:01Z')", True),
    ("1 / 0 > 0", "error"),                                # divide by zero
    ("facts.status > 3.0", "error"),                       # mismatched types
    ("facts.missing > 1.0", "error"),                      # a missing fact
    ("false && facts.missing > 1.0", False),               # CEL's commutative && absorbs the error
]


def _timed(fn: Callable[[], Any], repeat: int) -> float:
    """Median microseconds of `repeat` calls."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e6


class RustCel:
    """`common-expression-language` (import cel): bindings to the Rust cel crate."""
    name = "common-expression-language"

    def __init__(self) -> None:
        import cel
        self.cel = cel

    def compile(self, expr: str) -> Any:
        return self.cel.compile(expr)

    def run(self, program: Any, variables: dict[str, Any]) -> Any:
        return program.execute(variables)


class PyCel:
    """`cel-python` (import celpy): pure Python, a lark parser and a tree-walking evaluator."""
    name = "cel-python"

    def __init__(self) -> None:
        import celpy
        from celpy import celtypes
        self.celpy, self.celtypes = celpy, celtypes
        self.env = celpy.Environment()

    def compile(self, expr: str) -> Any:
        return self.env.program(self.env.compile(expr))

    def _value(self, v: Any) -> Any:
        if isinstance(v, datetime):
            return self.celtypes.TimestampType(v)
        if isinstance(v, dict):
            return self.celtypes.MapType({self.celtypes.StringType(k): self._value(x) for k, x in v.items()})
        return self.celpy.json_to_cel(v)

    def run(self, program: Any, variables: dict[str, Any]) -> Any:
        result = program.evaluate({k: self._value(v) for k, v in variables.items()})
        if isinstance(result, Exception):
            raise result
        return result


def measure(lib: Any) -> None:
    compile_us = statistics.median(_timed(lambda e=e: lib.compile(e), 50) for e in RULES)
    programs = [lib.compile(e) for e in RULES]
    eval_us = statistics.median(_timed(lambda p=p: lib.run(p, VARS), 300) for p in programs)
    right = 0
    print(f"{lib.name}: compile {compile_us:.1f} us/rule, evaluate {eval_us:.1f} us/rule (median of {len(RULES)} rules)")
    for expr, expected in CASES:
        try:
            got: Any = lib.run(lib.compile(expr), VARS)
            got = bool(got) if expected in (True, False) and got in (True, False) else got
        except Exception as e:  # noqa: BLE001 - any failure is the "error" outcome being measured
            got = f"error ({type(e).__name__})"
        ok = (expected == "error" and str(got).startswith("error")) or got == expected
        right += ok
        print(f"    {'ok ' if ok else 'BAD'} {expr:55} -> {got}")
    print(f"    {right}/{len(CASES)} cases as Keel needs them")


def main() -> None:
    for cls in (RustCel, PyCel):
        try:
            lib = cls()
        except ImportError as e:
            print(f"{cls.name}: not installed ({e})")
            continue
        measure(lib)


if __name__ == "__main__":
    main()
