"""The store contract's role suites against the embedded MemoryStore and the worker's RecordingStore."""
from support.admin_contract import StoreAdminContract
from support.batch_contract import BatchWritesContract
from support.reads_contract import StoreReadsContract

from keel.store.base import Store
from keel.store.memory import MemoryStore
from workers.mirror import RecordingStore


class TestMemoryStore(StoreReadsContract, BatchWritesContract, StoreAdminContract):
    def make_store(self) -> Store:
        return MemoryStore()

    def make_batch_store(self) -> Store:
        return MemoryStore()


class TestRecordingStore(StoreReadsContract, BatchWritesContract):
    """The mirror while a batch is planned: every write is recorded and waits; reads materialize it first."""

    def make_store(self) -> Store:
        store = RecordingStore()
        store.recording = True
        return store

    def make_batch_store(self) -> Store:
        return self.make_store()
