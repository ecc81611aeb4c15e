"""The series names Keel's processes export, read from their own prometheus_client registries, and the metric
names a PromQL expression reads (promql-parser, the Rust PromQL parser's Python binding): the alert rules
(deploy/prometheus) and the dashboard (deploy/grafana) may name only series that exist."""
from __future__ import annotations

import re
import warnings

import promql_parser
from prometheus_client import CollectorRegistry

from keel.ingress.metrics import RelayMetrics, WebhookMetrics
from tools_server.observe import Metrics
from workers.metrics import WorkerMetrics

# Names the rules and the dashboard use that issue 22 adds in parallel (the MCP server's HTTP statuses and
# sessions). Allowed although no registry above has them yet; `pending_report` says which are still missing.
# Remove a name here once its code registers it.
PENDING: frozenset[str] = frozenset()    # every name the rules and the dashboard use is registered now

# The sample names of each family type (prometheus_client's exposition; a labelled family without children has
# no sample yet, so the names come from the type).
SUFFIXES = {"counter": ("_total", "_created"), "gauge": ("",), "histogram": ("_bucket", "_count", "_sum", "_created"),
            "summary": ("", "_count", "_sum", "_created"), "info": ("_info",), "stateset": ("",), "enum": ("",),
            "unknown": ("",)}

GRAFANA_INTERVALS = re.compile(r"\$(__rate_interval|__interval|__range)\b|\$\{(__rate_interval|__interval|__range)\}")


def exported() -> set[str]:
    """Every series name of the worker, the MCP server, the outbox relay and the webhook."""
    registry = CollectorRegistry()
    WorkerMetrics(registry)
    Metrics(registry)
    RelayMetrics(registry, "any")
    WebhookMetrics(registry)
    return {family.name + suffix for family in registry.collect() for suffix in SUFFIXES[family.type]}


def pending_report(known: set[str]) -> list[str]:
    """Which PENDING names are still missing from the registries (printed and warned), and which are
    registered by now (warned: drop them from PENDING)."""
    missing = sorted(PENDING - known)
    present = sorted(PENDING & known)
    if missing:
        print(f"allowed but not registered yet: {', '.join(missing)}")
        warnings.warn(f"metric names allowed but not registered by Keel's code yet: {', '.join(missing)}",
                      stacklevel=2)
    if present:
        warnings.warn(f"registered now, remove from PENDING in tests/support/metric_names.py: {', '.join(present)}",
                      stacklevel=2)
    return missing


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects. Grafana's interval variables become 5m first; any other
    variable outside a string fails to parse. A name chosen by a regex on __name__ is returned as `~regex`
    so that it never passes as a known name."""
    expr = GRAFANA_INTERVALS.sub("5m", expr)
    names: set[str] = set()

    def visit(node: object) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            if node.name:
                names.add(node.name)
            for m in node.matchers.matchers:
                if m.name == "__name__":
                    names.add(m.value if m.op == promql_parser.MatchOp.Equal else f"~{m.value}")

    promql_parser.walk(promql_parser.parse(expr), visit)
    return names
