"""The store contract against the embedded MemoryStore."""
from support.store_contract import StoreContract

from keel.store.base import Store
from keel.store.memory import MemoryStore


class TestMemoryStore(StoreContract):
    def make_store(self) -> Store:
        return MemoryStore()
