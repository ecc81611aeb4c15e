"""One JSON log line and a few Prometheus series per tool call.

Series (text exposition format 0.0.4, served at /metrics on the HTTP transport):
  keel_tool_calls_total{tool,outcome}        outcome: ok | miss | error | crash
  keel_tool_latency_seconds{tool}            histogram
  keel_tool_result_bytes_total{tool}         bytes of JSON results sent
  keel_retrieval_failures_total{tool}        misses: a search with no result, an unknown entity
Labels never carry tenants or arguments, so /metrics leaks no tenant data and its cardinality is fixed.
"""
from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable

from .config import Identity

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
Labels = tuple[tuple[str, str], ...]


class Counter:
    def __init__(self, name: str, help: str) -> None:
        self.name, self.help = name, help
        self.values: dict[Labels, float] = {}

    def inc(self, labels: Labels, amount: float = 1.0) -> None:
        self.values[labels] = self.values.get(labels, 0.0) + amount

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} counter"
        for labels in sorted(self.values):
            yield f"{self.name}{_labels(labels)} {_num(self.values[labels])}"


class Histogram:
    def __init__(self, name: str, help: str, buckets: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        self.name, self.help, self.buckets = name, help, buckets
        self.series: dict[Labels, list[float]] = {}     # per-bucket counts, then +Inf count, then sum

    def observe(self, labels: Labels, value: float) -> None:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = [0.0] * (len(self.buckets) + 2)
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                s[i] += 1
        s[-2] += 1
        s[-1] += value

    def render(self) -> Iterable[str]:
        yield f"# HELP {self.name} {self.help}"
        yield f"# TYPE {self.name} histogram"
        for labels in sorted(self.series):
            s = self.series[labels]
            for bound, count in zip(self.buckets, s):
                yield f"{self.name}_bucket{_labels(labels + (('le', _num(bound)),))} {_num(count)}"
            yield f"{self.name}_bucket{_labels(labels + (('le', '+Inf'),))} {_num(s[-2])}"
            yield f"{self.name}_sum{_labels(labels)} {_num(s[-1])}"
            yield f"{self.name}_count{_labels(labels)} {_num(s[-2])}"


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v.replace(chr(92), chr(92) * 2).replace(chr(34), chr(92) + chr(34))}"'
                     for k, v in labels)
    return "{" + inner + "}"


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


class Metrics:
    """The tool-call series of one server."""

    def __init__(self) -> None:
        self.calls = Counter("keel_tool_calls_total", "Tool calls by tool and outcome.")
        self.latency = Histogram("keel_tool_latency_seconds", "Tool call latency in the server.")
        self.result_bytes = Counter("keel_tool_result_bytes_total", "Bytes of JSON results sent.")
        self.retrieval_failures = Counter("keel_retrieval_failures_total",
                                          "Reads that found nothing: a search without result, an unknown entity.")

    def render(self) -> str:
        lines: list[str] = []
        for series in (self.calls, self.latency, self.result_bytes, self.retrieval_failures):
            lines.extend(series.render())
        return "\n".join(lines) + "\n"


class Observer:
    """Records each call: a JSON line on `log` (if any) and the metrics."""

    def __init__(self, log: logging.Logger | None, metrics: Metrics | None = None) -> None:
        self.log = log
        self.metrics = metrics if metrics is not None else Metrics()

    def record(self, tool: str, identity: Identity | None, *, latency_s: float, result_bytes: int,
               outcome: str, miss: bool, error: str | None = None) -> None:
        tool_label = (("tool", tool),)
        m = self.metrics
        m.calls.inc(tool_label + (("outcome", outcome),))
        m.latency.observe(tool_label, latency_s)
        m.result_bytes.inc(tool_label, result_bytes)
        if miss:
            m.retrieval_failures.inc(tool_label)
        if self.log is not None and self.log.isEnabledFor(logging.INFO):
            line = {"ts": round(time.time(), 3), "event": "tool_call", "tool": tool,
                    "tenant": identity.tenant if identity else None, "agent": identity.agent if identity else None,
                    "task": identity.task if identity else None, "latency_ms": round(latency_s * 1000, 3),
                    "result_bytes": result_bytes, "outcome": outcome, "miss": miss}
            if error:
                line["error"] = error
            self.log.info(json.dumps(line, ensure_ascii=False, separators=(",", ":")))
