"""The store and batch contracts against the embedded MemoryStore and the worker's RecordingStore."""
from support.batch_contract import BatchContract, StateBehindContract
from support.store_contract import StoreContract

from keel.store.base import Store
from keel.store.memory import MemoryStore
from workers.mirror import RecordingStore


class TestMemoryStore(StoreContract, BatchContract, StateBehindContract):
    def make_store(self) -> Store:
        return MemoryStore()

    def make_batch_store(self) -> Store:
        return MemoryStore()


class TestRecordingStore(StoreContract, BatchContract):
    """The mirror while a batch is planned: every write is recorded and waits; reads materialize it first."""

    def make_store(self) -> Store:
        store = RecordingStore()
        store.recording = True
        return store

    def make_batch_store(self) -> Store:
        return self.make_store()
