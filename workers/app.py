"""The faust runtime of `keel worker`: an App built from Settings, its Worker, and one ingest Service per cartridge.

faust provides the process: service tree, startup/shutdown ordering, SIGTERM/SIGINT handling (stop
gracefully, finishing the in-flight batch), logging (`-l`), and crash → non-zero exit. Its Kafka consumer,
conductor and web server are not started: each cartridge's CartridgeIngest service owns its consumer
(see workers/ingest.py for why).
"""
from __future__ import annotations

import asyncio
import gc
import tempfile
from pathlib import Path

import faust
from faust.app.base import BootStrategy

from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import open_redis_store
from keel.kafka import bootstrap_list, ensure_topics
from keel.wire import dlq_topic, events_topic

from .ingest import CartridgeIngest, WorkerOptions


def create_app(cartridges: list[Cartridge], settings: Settings) -> faust.App:
    """A faust App for these cartridges (no module-level app: built per process from Settings)."""
    names = "+".join(sorted(c.name for c in cartridges))
    app = faust.App(f"keel-worker-{names}", broker=[f"kafka://{b}" for b in bootstrap_list(settings.kafka_bootstrap)],
                    web_enabled=False, autodiscover=False,
                    datadir=str(Path(tempfile.gettempdir()) / "keel-worker"))
    app.boot_strategy = BootStrategy(app, enable_kafka=False, enable_web=False)
    return app


def create_worker(cartridges: list[Cartridge], settings: Settings, options: WorkerOptions, *,
                  loglevel: str = "info", quiet: bool = False) -> faust.Worker:
    """The faust Worker running the app and one CartridgeIngest per cartridge."""
    app = create_app(cartridges, settings)
    services = [CartridgeIngest(c, settings, options) for c in cartridges]
    return faust.Worker(app, *services, loglevel=loglevel, quiet=quiet, redirect_stdouts=False)


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
