"""/healthz, /readyz and /metrics of a long-running process (`--metrics-port`, env KEEL_METRICS_PORT).

* `/healthz` (liveness) is 200 while every registered loop keeps turning: each loop calls `beat()` once
  per turn, and a loop that has not turned for `stall_after_s` seconds (a hung consume loop, a relay
  stuck on a call that never returns) makes it 503, not only a dead process. An orchestrator restarts it.
* `/readyz` (readiness) is 200 when every check passes (partitions assigned, Kafka and Redis or
  PostgreSQL reachable); each failing check is named in the 503 body.
* `/metrics` is the process's prometheus_client registry in the Prometheus text format.

It binds KEEL_METRICS_HOST (default 127.0.0.1; containers set 0.0.0.0 so probes and scrapers reach it).

The server runs on its own thread (the standard library's WSGI server with prometheus_client's WSGI
app), so it answers even while the process's event loop is busy, and a stalled loop shows as stale beats.
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

Check = Callable[[], str | None]      # None when fine, else why not

DEFAULT_STALL_S = 120.0


def add_probe_arguments(parser: argparse.ArgumentParser) -> None:
    """`--metrics-port` and `--stall-after` for a long-running process command."""
    parser.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                        help="serve /healthz, /readyz and /metrics on this port (env KEEL_METRICS_PORT; "
                             "bind address env KEEL_METRICS_HOST, default 127.0.0.1)")
    parser.add_argument("--stall-after", type=float, default=DEFAULT_STALL_S, metavar="SECONDS",
                        help=f"/healthz fails when a loop has not turned for this long (default {DEFAULT_STALL_S:.0f})")


def metrics_port(flag: int | None, env: Mapping[str, str] | None = None) -> int | None:
    """--metrics-port, else KEEL_METRICS_PORT, else None (no server)."""
    if flag is not None:
        return flag
    value = (os.environ if env is None else env).get("KEEL_METRICS_PORT")
    if not value:
        return None
    from .errors import UsageError
    try:
        port = int(value)
    except ValueError:
        raise UsageError(f"KEEL_METRICS_PORT={value!r} is not a port number") from None
    if not 0 <= port <= 65535:
        raise UsageError(f"KEEL_METRICS_PORT={value!r} is not a port number")
    return port


class Health:
    """Beats of the process's loops (liveness) and its readiness checks."""

    def __init__(self, stall_after_s: float = DEFAULT_STALL_S, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.stall_after_s = stall_after_s
        self.clock = clock
        self._beats: dict[str, float] = {}
        self._checks: dict[str, Check] = {}
        self._lock = threading.Lock()

    def beat(self, loop: str = "main") -> None:
        """The loop `loop` has turned (call once per iteration)."""
        with self._lock:
            self._beats[loop] = self.clock()

    def retire(self, loop: str) -> None:
        """The loop ended on purpose (a clean stop): it no longer counts."""
        with self._lock:
            self._beats.pop(loop, None)

    def check(self, name: str, fn: Check) -> None:
        """Add a readiness check."""
        self._checks[name] = fn

    def liveness(self) -> tuple[bool, dict[str, Any]]:
        now = self.clock()
        with self._lock:
            ages = {loop: round(now - t, 3) for loop, t in self._beats.items()}
        stalled = sorted(loop for loop, age in ages.items() if age > self.stall_after_s)
        doc: dict[str, Any] = {"status": "stalled" if stalled else "ok", "loops": ages}
        if stalled:
            doc["stalled"] = stalled
            doc["stall_after_s"] = self.stall_after_s
        return not stalled, doc

    def readiness(self) -> tuple[bool, dict[str, Any]]:
        failing: dict[str, str] = {}
        for name, fn in list(self._checks.items()):
            try:
                reason = fn()
            except Exception as e:  # noqa: BLE001 - a check that raises is a failing check, never a crashed probe
                reason = f"{type(e).__name__}: {e}"
            if reason:
                failing[name] = reason
        live, _ = self.liveness()
        if not live:
            failing["progress"] = "a loop stopped turning (see /healthz)"
        doc: dict[str, Any] = {"status": "ready" if not failing else "not ready", "checks": sorted(self._checks)}
        if failing:
            doc["failing"] = failing
        return not failing, doc


class _Threading(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:     # probes every few seconds: no access log
        return


def wsgi_app(health: Health, registry: CollectorRegistry) -> Callable[..., Iterable[bytes]]:
    """/healthz and /readyz from `health`, everything else from prometheus_client's app (/metrics)."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path in ("/healthz", "/readyz"):
            ok, doc = health.liveness() if path == "/healthz" else health.readiness()
            body = json.dumps(doc).encode()
            start_response("200 OK" if ok else "503 Service Unavailable",
                           [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        if path != "/metrics":
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"/healthz, /readyz or /metrics\n"]
        return metrics(environ, start_response)
    return app


class HealthServer:
    """The probe and metrics server of one process, on a daemon thread."""

    def __init__(self, health: Health, registry: CollectorRegistry, port: int, host: str | None = None) -> None:
        host = host or os.environ.get("KEEL_METRICS_HOST") or "127.0.0.1"
        try:
            self.server = make_server(host, port, wsgi_app(health, registry), server_class=_Threading,
                                      handler_class=_Quiet)
        except OSError as e:
            from .errors import UsageError
            raise UsageError(f"cannot serve /metrics on {host}:{port}: {e.strerror or e}") from e
        self.port = self.server.server_port
        self._thread = threading.Thread(target=self.server.serve_forever, name="keel-health", daemon=True)

    def start(self) -> HealthServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=5)
