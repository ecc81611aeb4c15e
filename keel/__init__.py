"""Keel: domain events → one bitemporal graph per tenant → five tools for every agent."""
from .cartridge import Cartridge, load_cartridge
from .digest import digest
from .envelope import Envelope, Event
from .errors import (
    BadTime,
    CartridgeInvalid,
    DomainError,
    EnvelopeRejected,
    HandlerFailed,
    KeelError,
    NoteRefused,
    StoreUnavailable,
    UnknownEntity,
    UnknownTenant,
    UsageError,
)
from .projector import Projector
from .registry import Registry
from .store.base import Store
from .store.memory import MemoryStore
from .tools import Tools

__all__ = ["BadTime", "Cartridge", "CartridgeInvalid", "DomainError", "Envelope", "EnvelopeRejected", "Event",
           "HandlerFailed", "KeelError", "MemoryStore", "NoteRefused", "Projector", "Registry", "Store",
           "StoreUnavailable", "Tools", "UnknownEntity", "UnknownTenant",
           "UsageError", "digest", "load_cartridge"]
