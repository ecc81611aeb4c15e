"""Where the tools read and write: a cartridge, its store and its log, and one Tools per caller identity, made
by the graph (keel.connect.Graph.tools) exactly as `keel.open(...).tools(...)` makes them for Python callers."""
from __future__ import annotations

import threading
from pathlib import Path
from typing import TextIO

from keel.audit import AuditWriter
from keel.cartridge import Cartridge
from keel.config import Settings
from keel.connect import Graph, GraphSet, open_graph
from keel.errors import StoreUnavailable
from keel.eventlog import EventLog
from keel.store.base import Store
from keel.tokens import Identity
from keel.tool_set import ToolSet
from keel.tools import Tools


class Backend:
    """Opened store and log of one cartridge, or a set of graphs of several (keel.connect.GraphSet). `blocking`
    backends (network stores) run calls in a thread."""

    def __init__(self, cartridge: Cartridge, store: Store, log: EventLog | None, *, blocking: bool,
                 allow_global_notes: bool = False, tenants: list[str] | None = None,
                 graph: Graph | GraphSet | None = None) -> None:
        self.cartridge = cartridge
        self.store = store
        self.log = log
        self.blocking = blocking
        self.allow_global_notes = allow_global_notes
        self.tenants = tenants
        self.graph: Graph | GraphSet = graph if graph is not None else Graph(cartridge, store, log, tenants, embedded=not blocking,
                                                           allow_global_notes=allow_global_notes)
        self.write_lock = self.graph.write_lock     # one annotate at a time through a shared log (reentrant)
        self.audit: AuditWriter | None = None       # where each tool call's record goes (keel.audit); closed with it
        self._tools: dict[Identity, Tools | ToolSet] = {}
        self._tools_lock = threading.Lock()

    @property
    def name(self) -> str:
        """The cartridge's name (or the cartridges', joined by -), for call records."""
        return self.graph.name if isinstance(self.graph, GraphSet) else self.cartridge.name

    def has_tenant(self, tenant: str) -> bool:
        return self.graph.has_tenant(tenant) if isinstance(self.graph, GraphSet) else self.store.has_tenant(tenant)

    def tools(self, identity: Identity) -> Tools | ToolSet:
        """The Tools bound to `identity` (made once, then reused: it caches the tenant's search index)."""
        tools = self._tools.get(identity)
        if tools is None:
            with self._tools_lock:
                tools = self._tools.get(identity)
                if tools is None:
                    tools = self.graph.tools(tenant=identity.tenant, agent=identity.agent, task=identity.task)
                    self._tools[identity] = tools
        return tools

    def unreachable(self) -> str | None:
        """Why the store does not answer now (None: it does, or it is in memory). For /readyz."""
        stores = [g.store for g in self.graph.graphs.values()] if isinstance(self.graph, GraphSet) else [self.store]
        for store in stores:
            ping = getattr(store, "ping", None)         # network stores have one
            if ping is None:
                continue
            try:
                ping()
            except StoreUnavailable as e:
                return str(e)
        return None

    def close(self) -> None:
        """Close the audit log and the graph: its lag meter and log (Kafka clients in Redis mode) and the store."""
        if self.audit is not None:
            self.audit.close()
        self.graph.close()

    @classmethod
    def of(cls, graph: Graph | GraphSet, settings: Settings) -> Backend:
        """The backend of an opened graph or set of graphs (keel.connect): network stores are `blocking`."""
        if isinstance(graph, GraphSet):                 # several cartridges: the first one's parts stand in for
            first = next(iter(graph.graphs.values()))    # the single-cartridge attributes; calls use the set
            return cls(first.cartridge, first.store, first.log, blocking=not graph.embedded,
                       allow_global_notes=settings.allow_global_notes, tenants=graph.tenants, graph=graph)
        return cls(graph.cartridge, graph.store, graph.log, blocking=not graph.embedded,
                   allow_global_notes=settings.allow_global_notes, tenants=graph.tenants, graph=graph)

    @classmethod
    def embedded(cls, cartridge: Cartridge, events: str | Path, *, allow_global_notes: bool = False,
                 stream: TextIO | None = None) -> Backend:
        """A memory store replayed from an events file; notes are appended to that file (bad lines → stream)."""
        settings = Settings(allow_global_notes=allow_global_notes)
        return cls.of(open_graph(cartridge, settings, events, stream=stream), settings)

    @classmethod
    def redis(cls, cartridge: Cartridge, url: str, settings: Settings) -> Backend:
        """The Redis graph the workers maintain; notes go to the cartridge's topic (keel.kafka_log.KafkaLog)."""
        return cls.of(open_graph(cartridge, settings.model_copy(update={"redis_url": url})), settings)
