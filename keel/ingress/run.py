"""Process runners of the ingress commands: signals (SIGTERM/SIGINT stop gracefully, SIGHUP reloads the
webhook's secrets), log lines on stderr, and the wiring of sources, sinks and servers."""
from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from keel.cartridge import Cartridge
from keel.health import DEFAULT_STALL_S, Health, HealthServer
from keel.oauth import JwtVerifier

from .auth import Secrets, load_secrets, loose_permissions
from .errors import ListenFailed, SecretsInvalid
from .metrics import Probes
from .outbox import OutboxTables
from .producer import KafkaSink, TopicSpec
from .relay import Log, RelayOptions, RelayStats, run_relay
from .sealing import IngressSealing
from .source import OutboxSource
from .webhook import Limits, WebhookHandler, create_app


def process_log(name: str) -> Log:
    """The log function of an ingress process: INFO lines of logger `name` (formatted by keel.logs)."""
    return logging.getLogger(name).info


@dataclass(frozen=True)
class ProcessOptions:
    """How an ingress process logs and exposes its probes and metrics (flags)."""
    log_format: str = "text"
    metrics_port: int | None = None       # None: no /healthz, /readyz, /metrics server
    stall_after_s: float = DEFAULT_STALL_S


@contextlib.contextmanager
def process_probes(process: ProcessOptions, log: Log) -> Iterator[Probes]:
    """The probes, with their server (when a port is given), for the life of the process."""
    probes = Probes(health=Health(process.stall_after_s))
    server = None
    if process.metrics_port is not None:
        server = HealthServer(probes.health, probes.registry, process.metrics_port).start()
        log(f"/healthz, /readyz and /metrics on port {server.port}")
    try:
        yield probes
    finally:
        if server is not None:
            server.stop()


def stop_on_signals(stop: asyncio.Event, log: Log) -> None:
    """SIGTERM and SIGINT set `stop` (the work in flight is finished first)."""
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if not stop.is_set():
            log(f"{signal.Signals(signum).name}: finishing the work in flight, then stopping")
        stop.set()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)


async def relay_main(cartridge: Cartridge, dsn: str, tables: OutboxTables, bootstrap: str, options: RelayOptions,
                     topics: TopicSpec, log: Log, process: ProcessOptions,
                     sealing: IngressSealing | None = None) -> RelayStats:
    """`keel outbox relay` until SIGTERM/SIGINT (or, with --once, until nothing is relayable)."""
    with process_probes(process, log) as probes:
        stop = asyncio.Event()
        stop_on_signals(stop, log)
        return await run_relay(cartridge, lambda: OutboxSource(dsn, tables), lambda: KafkaSink(bootstrap), options,
                               log, stop, topics=topics, probes=probes, sealing=sealing)


class NoSecrets:
    """No signing secrets (`keel webhook --issuer` without `--secrets`): only bearer tokens are accepted."""

    def __call__(self) -> Secrets:
        return Secrets({})

    def reload(self) -> None:
        return


class SecretsFile:
    """The webhook's secrets, reloadable (SIGHUP) without a restart; a bad file keeps the old secrets."""

    def __init__(self, path: Path, log: Log) -> None:
        self.path = path
        self.log = log
        self._secrets = load_secrets(path)
        if loose_permissions(path):
            log(f"warning: {path} is readable by group or others; chmod 600 it")

    def __call__(self) -> Secrets:
        return self._secrets

    def reload(self) -> None:
        try:
            self._secrets = load_secrets(self.path)
        except SecretsInvalid as e:
            self.log(f"secrets not reloaded, the previous ones stay in force: {e}")
            return
        self.log(f"reloaded secrets of {len(self._secrets)} tenant(s) from {self.path}")


async def webhook_main(cartridges: list[Cartridge], secrets: SecretsFile | NoSecrets, host: str, port: int,
                       bootstrap: str, limits: Limits, topics: TopicSpec, log: Log, progress_s: float = 10.0,
                       process: ProcessOptions | None = None, *, oauth: JwtVerifier | None = None,
                       sealing: dict[str, IngressSealing] | None = None) -> int:
    """`keel webhook` until SIGTERM/SIGINT: in-flight requests are answered before the producer closes."""
    with process_probes(process or ProcessOptions(), log) as probes:
        return await _webhook(cartridges, secrets, host, port, bootstrap, limits, topics, log, progress_s, probes,
                              oauth, sealing)


async def _webhook(cartridges: list[Cartridge], secrets: SecretsFile | NoSecrets, host: str, port: int,
                   bootstrap: str, limits: Limits, topics: TopicSpec, log: Log, progress_s: float, probes: Probes,
                   oauth: JwtVerifier | None, sealing: dict[str, IngressSealing] | None) -> int:
    stop = asyncio.Event()
    stop_on_signals(stop, log)
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, secrets.reload)
    sink = KafkaSink(bootstrap, client_id="keel-webhook")
    probes.watch("kafka")
    await sink.start()
    try:
        await sink.ensure_topics([t for c in cartridges for t in (c.topic, c.dlq_topic)], topics)
        probes.reachable("kafka")
        handler = WebhookHandler(cartridges, secrets, sink, limits, probes=probes, oauth=oauth, sealing=sealing)
        runner = web.AppRunner(create_app(handler, limits), access_log=None, handle_signals=False,
                               shutdown_timeout=30)
        await runner.setup()
        try:
            site = web.TCPSite(runner, host, port)
            try:
                await site.start()
            except OSError as e:
                raise ListenFailed(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
            bound = _bound_port(runner, port)
            paths = ", ".join(f"/events/{c.name}" for c in cartridges)
            log(f"listening on http://{host}:{bound} ({paths}); {len(secrets())} tenant(s); "
                f"max body {limits.max_body} bytes, max batch {limits.max_batch}")
            if host not in ("127.0.0.1", "::1", "localhost"):
                log(f"warning: bound to {host}: serve it behind TLS (signatures authenticate, they do not encrypt)")
            await _report_until(stop, handler, log, progress_s)
        finally:
            await runner.cleanup()
    finally:
        await sink.stop()
    log(f"stopped: {handler.counters.line()}")
    return 0


def _bound_port(runner: web.AppRunner, asked: int) -> int:
    for address in runner.addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return asked


async def _report_until(stop: asyncio.Event, handler: WebhookHandler, log: Log, every_s: float) -> None:
    """The counters line every `every_s`; the event loop's heartbeat every second (a blocked loop, which
    answers no request, shows as a stale beat on /healthz)."""
    health = handler.probes.health
    last, reported = handler.counters.line(), time.monotonic()
    while not stop.is_set():
        health.beat("event loop")
        try:
            await asyncio.wait_for(stop.wait(), min(every_s, 1.0))
        except TimeoutError:
            if time.monotonic() - reported < every_s:
                continue
            reported = time.monotonic()
            line = handler.counters.line()
            if line != last:
                log(line)
                last = line
    health.retire("event loop")
