"""The admin role of the store contract (keel.store.roles.StoreAdmin: tenants, holds_data, predates_watermarks),, written once; the memory store and the Redis store (single node and Cluster) subclass
StoreAdminContract.

    class TestMyStore(StoreAdminContract):
        def make_store(self) -> Store: ...   # a fresh, empty store
"""
from __future__ import annotations

from keel.store.base import GLOBAL_TENANT, Store

from .batch_contract import TOPIC, event
from .reads_contract import E, day


class StoreAdminContract:
    """Subclasses provide make_store(); every test starts from an empty store."""

    def make_store(self) -> Store:  # pragma: no cover - overridden
        raise NotImplementedError

    def test_a_new_store_holds_nothing_and_no_watermark(self) -> None:
        s = self.make_store()
        assert not s.holds_data() and s.tenants() == []
        assert not s.predates_watermarks()
        assert s.partitions_applied(TOPIC, [0, 3]) == {0: None, 3: None}

    def test_tenants_are_those_written_or_with_an_applied_event(self) -> None:
        s = self.make_store()
        s.open_fact("b", E, "p", 1, valid_from=day(1))
        s.apply_writes("a", [], "e0")                       # an applied event alone makes a tenant
        s.open_fact(GLOBAL_TENANT, "type:thing", "tip", "x", valid_from=day(1), scope="global")
        assert s.tenants() == sorted(["a", "b", GLOBAL_TENANT])
        assert all(s.has_tenant(t) for t in s.tenants()) and not s.has_tenant("c")
        assert s.holds_data()

    def test_a_watermark_alone_is_data(self) -> None:
        """A worker that finds Kafka commits but a store holding nothing re-applies the log: a namespace holding
        only a partition's watermark does hold something."""
        s = self.make_store()
        s.advance_partitions({(TOPIC, 0): 3}, {})
        assert s.holds_data() and s.tenants() == []

    def test_a_commit_makes_its_tenant(self) -> None:
        s = self.make_store()
        s.commit_many([("t1", [event(1)], (TOPIC, 0, 1)), ("t2", [], (TOPIC, 1, 4))])
        assert "t1" in s.tenants() and s.holds_data()
