"""The faust runtime of `keel worker`: an App built from Settings, its Worker, and one ingest Service per cartridge.

faust provides the process: service tree, startup/shutdown ordering, SIGTERM/SIGINT handling (stop
gracefully, finishing the in-flight batch), logging (`-l`), and crash → non-zero exit. Its Kafka consumer,
conductor and web server are not started: each cartridge's CartridgeIngest service owns its consumer
(see workers/ingest.py for why).
"""
from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import faust
from faust.app.base import BootStrategy
from prometheus_client import CollectorRegistry

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.errors import EXIT_UNAVAILABLE
from keel.health import DEFAULT_STALL_S, Health, HealthServer
from keel.kafka import bootstrap_list, ensure_topics
from keel.logs import LEVELS, dict_config
from keel.logs import install as install_log_limit
from keel.wire import dlq_topic, events_topic

from .collector import gc_young_threshold
from .diagnose import dump
from .ingest import CartridgeIngest, WorkerOptions
from .metrics import WorkerMetrics


@dataclass(frozen=True)
class ProcessOptions:
    """How the worker process logs and exposes its probes and metrics (flags)."""
    loglevel: str = "info"
    quiet: bool = False
    log_format: str = "text"
    metrics_port: int | None = None       # None: no /healthz, /readyz, /metrics server
    stall_after_s: float = DEFAULT_STALL_S


@dataclass
class Probes:
    """The worker's metrics registry and health state, shared by its ingest services."""
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)
    health: Health = field(default_factory=Health)

    def __post_init__(self) -> None:
        self.metrics = WorkerMetrics(self.registry)

TERM_BOUND_S = 14.0     # SIGTERM → exit, at the latest (the promise is 15 s; ingest's budget is 10 s)
EXIT_WATCHDOG = EXIT_UNAVAILABLE    # the watchdog ended the process (see docs/operations.md)


def create_app(cartridges: list[Cartridge], settings: Settings) -> faust.App:
    """A faust App for these cartridges (no module-level app: built per process from Settings)."""
    names = "+".join(sorted(c.name for c in cartridges))
    app = faust.App(f"keel-worker-{names}", broker=[f"kafka://{b}" for b in bootstrap_list(settings.kafka_bootstrap)],
                    web_enabled=False, autodiscover=False,
                    datadir=str(Path(tempfile.gettempdir()) / "keel-worker"))
    app.boot_strategy = BootStrategy(app, enable_kafka=False, enable_web=False)
    return app


class KeelWorker(faust.Worker):
    """faust's Worker, plus a promise: after SIGTERM/SIGINT the process ends within TERM_BOUND_S.

    The graceful path (workers/ingest.py: finish the write under way, close the clients, each bounded)
    normally takes well under that; the watchdog is for what cannot be bounded from inside the loop (a
    thread blocked in a client call, a library stuck in its own task). Ending there is as safe as SIGKILL:
    Redis holds each tenant's applied offset with its writes and redelivered records are skipped."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        stdout = getattr(self, "stdout", None)
        if stdout is None or not stdout.isatty():     # faust's spinner writes cursor escape codes even to files
            self.spinner = None

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        install_log_limit()       # faust replaced the handlers: library lines one per cause per interval again

    def _on_sigusr1(self) -> None:      # mode's: every thread's stack and local variables (personal data)
        dump(self.services)

    def _on_sigusr2(self) -> None:      # mode's: pdb, on a process without a terminal
        dump(self.services)

    def _schedule_shutdown(self, signal: signal.Signals) -> None:     # mode's hook for SIGTERM and SIGINT
        if not self._signal_stop_time:
            timer = threading.Timer(TERM_BOUND_S, _watchdog_exit, args=(signal.name,))
            timer.daemon = True
            timer.start()
        super()._schedule_shutdown(signal)


def _watchdog_exit(name: str) -> None:
    logging.getLogger("keel.worker").error("watchdog: still running %.0fs after %s; exiting now (what was not "
                                           "committed is redelivered)", TERM_BOUND_S, name)
    logging.shutdown()
    os._exit(EXIT_WATCHDOG)


def create_worker(cartridges: list[Cartridge], settings: Settings, options: WorkerOptions,
                  process: ProcessOptions, probes: Probes) -> faust.Worker:
    """The faust Worker running the app and one CartridgeIngest per cartridge, logging with Keel's format."""
    app = create_app(cartridges, settings)
    services = [CartridgeIngest(c, settings, options, metrics=probes.metrics.of(c.name), health=probes.health)
                for c in cartridges]
    level = LEVELS.get(process.loglevel, "INFO")
    logging_config = dict_config(process.log_format, level, libraries="DEBUG" if level == "DEBUG" else "WARNING")
    return KeelWorker(app, *services, loglevel=level, quiet=process.quiet, redirect_stdouts=False,
                      logging_config=logging_config)


def preflight(cartridges: list[Cartridge], settings: Settings, options: WorkerOptions) -> None:
    """Fail fast, with a one-line error, when Kafka or Redis cannot be reached; creates missing topics."""
    topics = [t for c in cartridges for t in (events_topic(c.name), dlq_topic(c.name))]
    asyncio.run(ensure_topics(settings.kafka_bootstrap, topics, options.topics))
    for c in cartridges:
        open_redis_store(c, settings).close()


def run_worker(cartridges: list[Cartridge], settings: Settings, options: WorkerOptions,
               process: ProcessOptions | None = None) -> int:
    """Check the services, then run until SIGTERM/SIGINT; returns the process exit code."""
    process = process or ProcessOptions()
    preflight(cartridges, settings, options)
    probes = Probes(health=Health(process.stall_after_s))
    server = None
    if process.metrics_port is not None:
        server = HealthServer(probes.health, probes.registry, process.metrics_port).start()
    gc.set_threshold(gc_young_threshold(options.batch), 50, 100)
    worker = create_worker(cartridges, settings, options, process, probes)
    try:
        worker.execute_from_commandline()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        if server is not None:
            server.stop()
    return 0
