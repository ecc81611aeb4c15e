"""One log line (keel.logs format, fields below) and a few Prometheus series per tool call.

Series (prometheus_client, served at /metrics on the HTTP transport):
  keel_tool_calls_total{tool,outcome}        outcome: ok | miss | error | crash
  keel_tool_latency_seconds{tool}            histogram
  keel_tool_result_bytes_total{tool}         bytes of JSON results sent
  keel_retrieval_failures_total{tool}        misses: a search with no result, an unknown entity
On the HTTP transport (tools_server.http):
  keel_mcp_http_responses_total{status}      responses to /mcp by HTTP status (429: a token over its limits)
  keel_mcp_sessions                          open MCP sessions (0 when stateless)
  keel_mcp_sessions_limit                    the most sessions the server opens (--max-sessions; 0 when stateless)
Labels never carry tenants or arguments, so /metrics leaks no tenant data and its cardinality is fixed.
"""
from __future__ import annotations

import logging

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from keel.logs import FIELDS
from keel.tokens import Identity

LATENCY_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The tool-call series of one server, in its own prometheus_client registry."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        r = self.registry
        self.calls = Counter("keel_tool_calls", "Tool calls by tool and outcome.", ["tool", "outcome"], registry=r)
        self.latency = Histogram("keel_tool_latency_seconds", "Tool call latency in the server.", ["tool"],
                                 buckets=LATENCY_BUCKETS, registry=r)
        self.result_bytes = Counter("keel_tool_result_bytes", "Bytes of JSON results sent.", ["tool"], registry=r)
        self.retrieval_failures = Counter("keel_retrieval_failures", "Reads that found nothing: a search without "
                                          "result, an unknown entity.", ["tool"], registry=r)
        self.http_responses = Counter("keel_mcp_http_responses", "Responses to /mcp by HTTP status code.",
                                      ["status"], registry=r)
        self.sessions = Gauge("keel_mcp_sessions", "Open MCP sessions of the HTTP transport.", registry=r)
        self.sessions_limit = Gauge("keel_mcp_sessions_limit", "The most MCP sessions the HTTP transport opens "
                                    "(0: no sessions, stateless).", registry=r)

    def render(self) -> str:
        return generate_latest(self.registry).decode()


class Observer:
    """Records each call: a JSON line on `log` (if any) and the metrics."""

    def __init__(self, log: logging.Logger | None, metrics: Metrics | None = None) -> None:
        self.log = log
        self.metrics = metrics if metrics is not None else Metrics()

    def record(self, tool: str, identity: Identity | None, *, latency_s: float, result_bytes: int,
               outcome: str, miss: bool, error: str | None = None) -> None:
        m = self.metrics
        m.calls.labels(tool, outcome).inc()
        m.latency.labels(tool).observe(latency_s)
        m.result_bytes.labels(tool).inc(result_bytes)
        if miss:
            m.retrieval_failures.labels(tool).inc()
        if self.log is not None and self.log.isEnabledFor(logging.INFO):
            fields = {"event": "tool_call", "tool": tool, "tenant": identity.tenant if identity else None,
                      "agent": identity.agent if identity else None, "task": identity.task if identity else None,
                      "latency_ms": round(latency_s * 1000, 3), "result_bytes": result_bytes, "outcome": outcome,
                      "miss": miss}
            if error:
                fields["error"] = error
            self.log.info("tool_call", extra={FIELDS: fields})
