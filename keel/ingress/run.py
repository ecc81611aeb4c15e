"""Process runners of the ingress commands: signals (SIGTERM/SIGINT stop gracefully, SIGHUP reloads the
webhook's secrets), log lines on stderr, and the wiring of sources, sinks and servers."""
from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from pathlib import Path
from typing import TextIO

from aiohttp import web

from keel.cartridge import Cartridge
from keel.logs import install as install_log_limit

from .auth import Secrets, load_secrets, loose_permissions
from .errors import ListenFailed, SecretsInvalid
from .outbox import OutboxTables
from .producer import KafkaSink, TopicSpec
from .relay import Log, RelayOptions, RelayStats, run_relay
from .source import OutboxSource
from .webhook import Limits, WebhookHandler, create_app


def stderr_log(name: str, stream: TextIO | None = None) -> Log:
    """A log function writing `<UTC time> <name>: <message>` lines, flushed at once."""
    out = stream if stream is not None else sys.stderr

    def log(message: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        print(f"{stamp} {name}: {message}", file=out, flush=True)
    return log


def library_logging() -> None:
    """Warnings of the client libraries (aiokafka retries, aiohttp server errors) as timestamped lines."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(name)s: %(levelname)s %(message)s")
    install_log_limit()       # one line per cause per interval (Kafka down: aiokafka logs every retry)


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
                     topics: TopicSpec, log: Log) -> RelayStats:
    """`keel outbox relay` until SIGTERM/SIGINT (or, with --once, until nothing is relayable)."""
    library_logging()
    stop = asyncio.Event()
    stop_on_signals(stop, log)
    return await run_relay(cartridge, lambda: OutboxSource(dsn, tables), lambda: KafkaSink(bootstrap), options,
                           log, stop, topics=topics)


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


async def webhook_main(cartridges: list[Cartridge], secrets: SecretsFile, host: str, port: int, bootstrap: str,
                       limits: Limits, topics: TopicSpec, log: Log, progress_s: float = 10.0) -> int:
    """`keel webhook` until SIGTERM/SIGINT: in-flight requests are answered before the producer closes."""
    library_logging()
    stop = asyncio.Event()
    stop_on_signals(stop, log)
    asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, secrets.reload)
    sink = KafkaSink(bootstrap, client_id="keel-webhook")
    await sink.start()
    try:
        await sink.ensure_topics([t for c in cartridges for t in (c.topic, c.dlq_topic)], topics)
        handler = WebhookHandler(cartridges, secrets, sink, limits)
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
    last = handler.counters.line()
    while not stop.is_set():
        try:
            await asyncio.wait_for(stop.wait(), every_s)
        except TimeoutError:
            line = handler.counters.line()
            if line != last:
                log(line)
                last = line
