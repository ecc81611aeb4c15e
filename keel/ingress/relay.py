"""`keel outbox relay`: outbox rows → the cartridge's topic, at least once, in (xid, position) order.

One step: read up to `batch` rows past the cursor from finished transactions (see source.py), check each
envelope with the catalog, produce valid ones (canonical form, key = tenant) and invalid ones (dead-letter
topic, the row's text and the reason in headers; see encode.py), wait for Kafka's acknowledgement of all of
them, then store the cursor. A crash between the acknowledgement and the cursor write re-sends that batch:
duplicates are harmless downstream because envelope ids are idempotency keys. A bad row never blocks the
relay. Order on the topic: (xid, position), i.e. per tenant the order of the outbox. A cartridge's personal
fields are sealed before they are produced (sealing.py); a key store that cannot answer stops the step, which
is retried like a lost database.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from keel.cartridge import Cartridge
from keel.errors import StoreUnavailable
from keel.health import Health

from .encode import Encoded, RowEncoder
from .errors import KafkaUnavailable, OutboxUnavailable, RelayBusy
from .metrics import Probes, RelayMetrics
from .producer import Acks, KafkaSink, TopicSpec
from .sealing import IngressSealing
from .source import START, Cursor, OutboxSource
from .xmin import XminWatch

Log = Callable[[str], None]


@dataclass(frozen=True)
class RelayOptions:
    name: str                       # the cursor's name (default: the cartridge name)
    batch: int = 2000               # rows per step
    interval_s: float = 0.2         # idle wait between polls
    xmin_warn_s: float = 30.0       # log when committed rows waited this long on the same xmin
    progress_s: float = 10.0        # progress line period
    prune: bool = False             # delete rows every relay of the table has relayed
    once: bool = False              # relay what is relayable now, then exit


@dataclass
class RelayStats:
    relayed: int = 0
    dead_lettered: int = 0
    steps: int = 0
    cursor: Cursor = START
    started: float = field(default_factory=time.monotonic)

    def line(self) -> str:
        """Totals since start (the closing line)."""
        elapsed = max(time.monotonic() - self.started, 1e-9)
        return (f"relayed {self.relayed} event(s), {self.dead_lettered} dead letter(s) in {elapsed:.1f}s "
                f"({(self.relayed + self.dead_lettered) / elapsed:,.0f} rows/s); cursor {self.cursor}")

    def since(self, before: tuple[int, float]) -> str:
        """Progress since `before` = (rows, monotonic time) (the periodic line)."""
        rows = self.relayed + self.dead_lettered - before[0]
        elapsed = max(time.monotonic() - before[1], 1e-9)
        return (f"relayed {self.relayed} event(s), {self.dead_lettered} dead letter(s) so far; "
                f"{rows} row(s) in the last {elapsed:.0f}s ({rows / elapsed:,.0f}/s); cursor {self.cursor}")

    def mark(self) -> tuple[int, float]:
        return self.relayed + self.dead_lettered, time.monotonic()


class Relay:
    """The relay loop of one cartridge over one outbox table."""

    def __init__(self, cartridge: Cartridge, source: OutboxSource, sink: KafkaSink, options: RelayOptions,
                 log: Log, stats: RelayStats | None = None, *, metrics: RelayMetrics | None = None,
                 health: Health | None = None, sealing: IngressSealing | None = None) -> None:
        self.cartridge = cartridge
        self.metrics = metrics
        self.health = health or Health()
        self.source = source
        self.sink = sink
        self.options = options
        self.log = log
        self.encoder = RowEncoder(cartridge, sink, str(source.tables), sealing)
        self.watch = XminWatch(source, options.xmin_warn_s, log)
        self.stats = stats if stats is not None else RelayStats()
        self._pruned = START

    async def run(self, stop: asyncio.Event) -> RelayStats:
        """Relay until `stop` is set (or, with `once`, until nothing is relayable). Steps overlap: while
        Kafka acknowledges step n (then its cursor is stored), step n+1 is read and encoded. The steps in
        flight are always finished, so a stop leaves no acknowledged step without its cursor."""
        opts = self.options
        cursor = await self.source.load_cursor(opts.name)
        self.stats.cursor = cursor
        self.log(f"relaying {self.source.tables} -> {self.cartridge.topic} as {opts.name!r} from cursor {cursor}")
        inflight: asyncio.Task[None] | None = None
        last_progress = self.stats.mark()
        try:
            while not stop.is_set():
                self.health.beat(BEAT)
                rows = await self.source.read(cursor, opts.batch)
                if rows:
                    encoded = self.encoder.encode(rows)
                    produced = time.perf_counter()
                    acks = await self.sink.enqueue(encoded.records)
                    cursor = rows[-1].cursor
                    previous, inflight = inflight, None
                    if previous is not None:
                        await previous                      # at most two steps in flight
                    inflight = asyncio.create_task(self._confirm(acks, cursor, encoded, produced))
                if time.monotonic() - last_progress[1] >= opts.progress_s:
                    self.log(self.stats.since(last_progress))
                    last_progress = self.stats.mark()
                if len(rows) == opts.batch:
                    continue
                if inflight is not None:
                    previous, inflight = inflight, None
                    await previous
                held = await self.watch.check(cursor, force=opts.once)
                if opts.once:
                    if held is not None and held.rows:
                        self.log(f"{held.rows} committed row(s) wait for transactions older than them to finish "
                                 f"(xmin {held.xmin}); they are relayed by a later run")
                    break
                await _sleep_unless(stop, opts.interval_s)
            if inflight is not None:
                previous, inflight = inflight, None
                await previous
        finally:
            if inflight is not None:                        # an error elsewhere: never leave the task behind
                inflight.cancel()
                await asyncio.gather(inflight, return_exceptions=True)
        return self.stats

    async def _confirm(self, acks: Acks, cursor: Cursor, encoded: Encoded, produced: float) -> None:
        """Wait for Kafka's acknowledgement of a step, then store its cursor (and prune)."""
        await self.sink.confirm(acks)
        await self.source.store_cursor(self.options.name, cursor, encoded.relayed, encoded.dead)
        if self.metrics is not None:
            self.metrics.relayed.inc(encoded.relayed)
            self.metrics.dead_lettered.inc(encoded.dead)
            self.metrics.batch_size.observe(encoded.relayed + encoded.dead)
            self.metrics.commit_latency.observe(time.perf_counter() - produced)
        self.stats.relayed += encoded.relayed
        self.stats.dead_lettered += encoded.dead
        self.stats.steps += 1
        self.stats.cursor = cursor
        if self.options.prune:
            self._pruned = await self.source.prune(self._pruned) or self._pruned


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        return


@dataclass(frozen=True)
class Backoff:
    first_s: float = 0.5
    max_s: float = 30.0


async def run_relay(cartridge: Cartridge, make_source: Callable[[], OutboxSource],
                    make_sink: Callable[[], KafkaSink], options: RelayOptions, log: Log,
                    stop: asyncio.Event, *, topics: TopicSpec | None = None,
                    backoff: Backoff | None = None, probes: Probes | None = None,
                    sealing: IngressSealing | None = None) -> RelayStats:
    """Open the connections, take the relay's lock, create missing topics and run; on a lost database or
    Kafka, log, wait and start again from the stored cursor (with `once`, fail instead).

    `probes`: readiness follows PostgreSQL and Kafka; liveness follows the loop (standing by and retrying
    count as turning); metrics count rows, steps and outages. `sealing`: the cartridge's personal fields are
    sealed with its key store (a key store outage is retried like the others, probe `keys`)."""
    topics = topics or TopicSpec()
    backoff = backoff or Backoff()
    probes = probes or Probes()
    metrics = RelayMetrics(probes.registry, cartridge.name)
    probes.watch("postgres")
    probes.watch("kafka")
    keys = sealing is not None and sealing.privacy is not None
    if keys:
        probes.watch("keys")
    stats = RelayStats()
    delay = backoff.first_s
    while not stop.is_set():
        probes.health.beat(BEAT)
        source, sink = make_source(), make_sink()
        try:
            await source.open()
            probes.reachable("postgres")
            if not await _lock(source, options, log, stop, probes.health):
                break
            await sink.start()
            await sink.ensure_topics([cartridge.topic, cartridge.dlq_topic], topics)
            probes.reachable("kafka")
            delay = backoff.first_s
            if keys:
                probes.reachable("keys")       # asked again by the first step that seals
            metrics.active.set(1)
            await Relay(cartridge, source, sink, options, log, stats, metrics=metrics, health=probes.health,
                        sealing=sealing).run(stop)
            break
        except (OutboxUnavailable, KafkaUnavailable, StoreUnavailable) as e:
            system = ("postgres" if isinstance(e, OutboxUnavailable) else "kafka" if isinstance(e, KafkaUnavailable)
                      else "keys")
            probes.unreachable(system, e)
            if system != "keys":
                (metrics.postgres_errors if system == "postgres" else metrics.kafka_errors).inc()
            if options.once:
                raise
            log(f"{e}; retrying in {delay:.1f}s from the stored cursor")
            await _sleep_unless(stop, delay)
            delay = min(delay * 2, backoff.max_s)
        finally:
            metrics.active.set(0)
            await _close(source, sink, log)
    probes.health.retire(BEAT)
    log(f"stopped: {stats.line()}")
    return stats


BEAT = "relay"


async def _lock(source: OutboxSource, options: RelayOptions, log: Log, stop: asyncio.Event, health: Health) -> bool:
    waited = False
    while not await source.try_lock(options.name):
        health.beat(BEAT)
        if options.once:
            raise RelayBusy(options.name, source.tables)
        if not waited:
            log(f"another relay named {options.name!r} holds {source.tables}; standing by")
            waited = True
        await _sleep_unless(stop, 2.0)
        if stop.is_set():
            return False
    if waited:
        log("took over the relay lock")
    return True


async def _close(source: OutboxSource, sink: KafkaSink, log: Log) -> None:
    try:
        await sink.stop()
    except KafkaUnavailable as e:
        log(f"closing the Kafka producer: {e}")
    await source.close()
