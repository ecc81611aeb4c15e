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
from pathlib import Path

import faust
from faust.app.base import BootStrategy

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.errors import EXIT_UNAVAILABLE
from keel.kafka import bootstrap_list, ensure_topics
from keel.logs import install as install_log_limit
from keel.wire import dlq_topic, events_topic

from .ingest import CartridgeIngest, WorkerOptions

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

    def on_setup_root_logger(self, logger: logging.Logger, level: int) -> None:
        install_log_limit()       # faust replaced the handlers: library lines one per cause per interval again

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


def create_worker(cartridges: list[Cartridge], settings: Settings, options: WorkerOptions, *,
                  loglevel: str = "info", quiet: bool = False) -> faust.Worker:
    """The faust Worker running the app and one CartridgeIngest per cartridge."""
    app = create_app(cartridges, settings)
    services = [CartridgeIngest(c, settings, options) for c in cartridges]
    return KeelWorker(app, *services, loglevel=loglevel, quiet=quiet, redirect_stdouts=False)


def preflight(cartridges: list[Cartridge], settings: Settings, options: WorkerOptions) -> None:
    """Fail fast, with a one-line error, when Kafka or Redis cannot be reached; creates missing topics."""
    topics = [t for c in cartridges for t in (events_topic(c.name), dlq_topic(c.name))]
    asyncio.run(ensure_topics(settings.kafka_bootstrap, topics, options.topics))
    for c in cartridges:
        open_redis_store(c, settings).close()


def run_worker(cartridges: list[Cartridge], settings: Settings, options: WorkerOptions, *,
               loglevel: str = "info", quiet: bool = False) -> int:
    """Check the services, then run until SIGTERM/SIGINT; returns the process exit code."""
    preflight(cartridges, settings, options)
    # The mirrors are millions of long-lived small objects: scan them less often (collection pauses
    # otherwise grow with the mirrored graph and cost ~20% of the batch time).
    gc.set_threshold(100_000, 50, 100)
    worker = create_worker(cartridges, settings, options, loglevel=loglevel, quiet=quiet)
    try:
        worker.execute_from_commandline()
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return 0
