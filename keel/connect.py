"""Where a command's graph lives, decided and opened in one place for every command and server.

An events file means embedded mode: the file replayed into a MemoryStore, notes appended to the file.
Otherwise the Redis URL of the resolved settings (`--redis`, else KEEL_REDIS_URL) means the graph the
workers maintain, with notes produced to the cartridge's topic (KafkaLog). So KEEL_REDIS_URL means the same
thing to `keel context`, `keel digest`, `keel serve`, `keel worker`, `keel status` and `keel replay`.

A Graph hands out the five tools (`Graph.tools`): the one way the CLI, the MCP server and Python callers
(`keel.open`, keel/api.py) get them.
"""
from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TextIO

from .cartridge import Cartridge
from .cartridge_set import CartridgeSet
from .config import Settings
from .embedded import Reveal, build_embedded
from .errors import UsageError
from .eventlog import EventLog, FileLog
from .keystore import KeyStore
from .privacy import Privacy
from .store.base import Store
from .tool_set import ToolSet
from .tools import SearchIndexes, Tools
from .wire import events_topic

if TYPE_CHECKING:
    from .log_lag import LogLag
    from .store.redis import RedisStore


@dataclass
class Graph:
    """An opened graph: its store, the log annotate writes to, and (embedded) the tenants of the file.

    Safe to share between threads: an embedded graph (a MemoryStore changed in place by annotate) runs one
    call at a time; on Redis, reads run side by side and annotate calls one at a time (one Kafka producer)."""
    cartridge: Cartridge
    store: Store
    log: EventLog | None
    tenants: list[str] | None = None        # None: unknown (Redis); a file lists the tenants it holds
    events: Path | None = None
    embedded: bool = False
    allow_global_notes: bool = False        # the operator switch (Settings.allow_global_notes)
    write_lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)
    lag: LogLag | None = field(default=None, repr=False, compare=False)   # Redis: the lag from the log's end
    _indexes: SearchIndexes = field(default_factory=dict, repr=False, compare=False)

    def tools(self, *, tenant: str, agent: str | None = None, task: str | None = None) -> Tools:
        """The five tools for one caller: `tenant`, and the `agent` and `task` whose private notes it reads and
        writes (task notes need a task). Cheap: make one per request or per conversation if that is simpler."""
        for name, value in (("agent", agent), ("task", task)):
            if value is not None and (not isinstance(value, str) or not value or len(value) > 256):
                raise UsageError(f"bad {name} {value!r}: a non-empty string of at most 256 characters, or None")
        reads: AbstractContextManager[object] = self.write_lock if self.embedded else nullcontext()
        return Tools(self.cartridge, self.store, tenant, agent=agent, task=task, log=self.log,
                     allow_global_notes=self.allow_global_notes, search_indexes=self._indexes,
                     read_lock=reads, write_lock=self.write_lock, lag=self.lag)

    def close(self) -> None:
        """Close the log (a Kafka producer in Redis mode) and the store (its connections). Calls still running
        on other threads must have returned."""
        if self.lag is not None:
            self.lag.close()
        close_graph(self.store, self.log)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class GraphSet:
    """Several cartridges' graphs read as one (keel.cartridge_set): `tools` answers over all of them for a
    tenant (keel.tool_set.ToolSet). Each graph keeps its own store, log, topic and namespace."""
    cartridges: CartridgeSet
    graphs: dict[str, Graph]                 # cartridge name -> its graph
    write_lock: threading.RLock = field(default_factory=threading.RLock, repr=False, compare=False)

    @property
    def name(self) -> str:
        return self.cartridges.name

    @property
    def embedded(self) -> bool:
        return all(g.embedded for g in self.graphs.values())

    @property
    def tenants(self) -> list[str] | None:
        """The tenants of the events files (None: a Redis graph, which does not list them)."""
        found = [g.tenants for g in self.graphs.values()]
        return None if any(t is None for t in found) else sorted({t for ts in found for t in ts or ()})

    def has_tenant(self, tenant: str) -> bool:
        return any(g.store.has_tenant(tenant) for g in self.graphs.values())

    def tools(self, *, tenant: str, agent: str | None = None, task: str | None = None) -> ToolSet:
        """The five tools over every cartridge for one caller (as Graph.tools)."""
        return ToolSet(self.cartridges, {name: g.tools(tenant=tenant, agent=agent, task=task)
                                         for name, g in self.graphs.items()})

    def close(self) -> None:
        """Close every graph, even when closing one fails (that failure is raised after)."""
        with ExitStack() as stack:
            for graph in self.graphs.values():
                stack.callback(graph.close)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_graphs(cartridges: list[Cartridge], settings: Settings,
                events: str | Path | Sequence[str | Path] | None = None, *,
                stream: TextIO | None = None, keys: KeyStore | None = None) -> Graph | GraphSet:
    """One cartridge's graph (open_graph), or several read as one: on Redis each cartridge's namespace; embedded,
    one events file per cartridge in the cartridges' order (a list, or paths separated by commas)."""
    if len(cartridges) == 1:
        if events is not None and not isinstance(events, (str, Path)):
            [events] = events
        return open_graph(cartridges[0], settings, events, stream=stream, keys=keys)
    if events is not None and settings.clear:
        warn_clear(cartridges, stream)      # one line for the set, before any file is read
    together = CartridgeSet(cartridges)
    files: list[str | Path | None] = [None] * len(cartridges)
    if events is not None:
        files = [f.strip() for f in events.split(",")] if isinstance(events, str) else list(
            events if not isinstance(events, Path) else [events])
        if len(files) != len(cartridges):
            raise UsageError(f"give one events file per cartridge, separated by commas in the cartridges' order "
                             f"({len(cartridges)} cartridges, {len(files)} files)")
    graphs: dict[str, Graph] = {}
    try:
        for cartridge, file in zip(cartridges, files):
            graphs[cartridge.name] = open_graph(cartridge, settings, file, stream=stream, keys=keys, warned=True)
    except BaseException:
        GraphSet(together, graphs).close()
        raise
    return GraphSet(together, graphs)


CLEAR_ON_REDIS = ("--clear reads an events file's personal fields in clear, for one embedded run; the Kafka/Redis "
                  "path never takes them in clear (seal them: docs/privacy.md)")


def reveal_of(cartridge: Cartridge, keys: KeyStore | None, *, clear: bool = False) -> Reveal | None:
    """The step that reads an events file's personal fields (keel.privacy.Privacy.reveal_line): sealed ones
    decrypted with `keys`, clear ones refused unless the cartridge accepts them or `clear` (`--clear`) says so for
    this run; None for a cartridge without personal fields and no key store (nothing to reveal)."""
    if keys is None and not cartridge.spec.personal:
        return None
    privacy = Privacy(cartridge, keys)
    return partial(privacy.reveal_line, clear_ok=True) if clear else privacy.reveal_line


def warn_clear(cartridges: Sequence[Cartridge], stream: TextIO | None = None, *, cause: str = "--clear") -> None:
    """The one line on stderr (or `stream`) of `--clear`, naming the cartridges whose personal fields are read in
    clear: what a sealed log protects (erasure) does not apply to what this run reads."""
    names = list(dict.fromkeys(c.name for c in cartridges if c.spec.personal and not c.spec.personal_accept_clear))
    if names:
        print(f"keel: warning: {cause}: personal fields of {', '.join(repr(n) for n in names)} are read in clear "
              f"for this run only; nothing of them is sealed or erasable: seal the file (`keel seal`) before it "
              f"holds real people's data (docs/privacy.md)", file=stream if stream is not None else sys.stderr)


def close_graph(store: Store, log: EventLog | None) -> None:
    """Close the log (a Kafka producer in Redis mode; a file log has nothing to close), then the store."""
    close_log = getattr(log, "close", None)
    try:
        if callable(close_log):
            close_log()
    finally:
        store.close()


def redis_url(settings: Settings) -> str:
    """The Redis URL of the settings, or a usage error naming both ways to give one."""
    if not settings.redis_url:
        raise UsageError("no Redis URL: pass --redis URL or set KEEL_REDIS_URL")
    return settings.redis_url


def open_redis_store(cartridge: Cartridge, settings: Settings, **options: Any) -> RedisStore:
    """The cartridge's Redis graph (namespace = cartridge name); options go to RedisStore.from_url."""
    from .store.redis import RedisStore  # redis-py is imported by the commands that use it only
    store = RedisStore.from_url(redis_url(settings), namespace=cartridge.name, **options)
    if settings.cold_dsn:               # the cold tier (keel/cold_pg.py): connected at its first use
        from .cold_pg import ColdStore  # psycopg only where a cold tier is configured
        store.cold = ColdStore(settings.cold_dsn)
    return store


def open_event_log(cartridge: Cartridge, store: Store, settings: Settings) -> EventLog:
    """The log of Redis mode: annotate produces to the cartridge's topic and waits until a worker applied it."""
    from .kafka_log import KafkaLog
    return KafkaLog(cartridge, store, settings)


def open_graph(cartridge: Cartridge, settings: Settings, events: str | Path | None = None, *,
               stream: TextIO | None = None, keys: KeyStore | None = None, warned: bool = False) -> Graph:
    """An events file when given (embedded), else the Redis graph of the settings (usage error when neither).
    `keys`: the key store that decrypts the personal fields of an events file (docs/privacy.md); with
    `settings.clear` (`--clear`) personal fields in clear are read as they are, after one warning on `stream`
    (`warned`: open_graphs gave it for the set), and the Redis graph is refused."""
    if keys is not None and events is None:
        raise UsageError("a key store (--keys) decrypts an events file; the Redis graph does not take one yet")
    if events is not None:
        path = Path(events)         # a missing, unreadable or folder path: build_embedded says which (usage)
        # reading the file's global notes needs no switch; Tools applies it to writing them (docs/semantics.md)
        if settings.clear and not warned:
            warn_clear([cartridge], stream)
        reveal = reveal_of(cartridge, keys, clear=settings.clear)
        projector, report = build_embedded(cartridge, path, allow_global_notes=True, stream=stream, reveal=reveal)
        return Graph(cartridge, projector.store, FileLog(projector, path), sorted(report.tenants), path, True,
                     settings.allow_global_notes)
    if not settings.redis_url:
        raise UsageError("give an events file (embedded) or --redis URL (or set KEEL_REDIS_URL)")
    if settings.clear:
        raise UsageError(CLEAR_ON_REDIS)
    store = open_redis_store(cartridge, settings)
    try:
        log = open_event_log(cartridge, store, settings)
    except BaseException:
        store.close()
        raise
    from .log_lag import LogLag  # Kafka's client only for the Redis graph (like its log)
    return Graph(cartridge, store, log, allow_global_notes=settings.allow_global_notes,
                 lag=LogLag(settings.kafka_bootstrap, events_topic(cartridge.name), store))
