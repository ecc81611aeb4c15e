"""Keel: domain events → one bitemporal graph per tenant → five tools for every agent.

    import keel
    with keel.open("cartridges/finance", events="events.jsonl") as graph:     # or redis=URL (KEEL_* defaults)
        tools = graph.tools(tenant="hogar-demo", agent="debts", task="visa-plan")
        tools.context("debt:visa", at="2026-09-15")

`__all__` is the public API; docs/python.md says which names are stable.
"""
from .api import open, open_several
from .cartridge import Cartridge, load_cartridge
from .connect import Graph, GraphSet
from .digest import digest
from .envelope import Envelope, Event
from .errors import (
    BadTime,
    CartridgeInvalid,
    DomainError,
    EnvelopeRejected,
    HandlerFailed,
    KafkaUnavailable,
    KeelError,
    NoteRefused,
    ServiceUnavailable,
    StoreUnavailable,
    UnknownEntity,
    UnknownTenant,
    UsageError,
)
from .producer import Sealer, sealer
from .projector import Projector
from .registry import Registry
from .results import (
    AnnotateResult,
    Change,
    ChangesResult,
    ContextResult,
    Fact,
    FactVersion,
    HistoryResult,
    LabelVersion,
    RelatedResult,
    Relation,
    RelationVersion,
    Scope,
    SearchHit,
    SearchResult,
)
from .store.base import Store
from .store.memory import MemoryStore
from .tool_args import Time
from .tool_set import ToolSet
from .tools import Tools

# The public names, listed once; docs/python.md says which are stable.
__all__ = [
    "AnnotateResult", "BadTime", "Cartridge", "CartridgeInvalid", "Change", "ChangesResult", "ContextResult",
    "DomainError",
    "Envelope", "EnvelopeRejected", "Event", "Fact", "FactVersion", "Graph", "GraphSet", "HandlerFailed",
    "HistoryResult", "KafkaUnavailable", "KeelError", "LabelVersion", "MemoryStore", "NoteRefused",
    "Projector", "Registry", "RelatedResult", "Relation", "RelationVersion", "Scope", "Sealer",
    "SearchHit", "SearchResult", "ServiceUnavailable", "Store", "StoreUnavailable", "Time", "ToolSet", "Tools",
    "UnknownEntity",
    "UnknownTenant", "UsageError", "digest", "load_cartridge", "open", "open_several", "sealer",
]
