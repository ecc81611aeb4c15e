"""The store contract and Redis-specific guarantees against a real redis-server (KEEL_REDIS_URL).

Every test works in a fresh namespace and deletes it afterwards, so a shared server is fine. Without
KEEL_REDIS_URL the tests skip (or fail under KEEL_REQUIRE_SERVICES=1). tests/test_redis_cluster.py runs
the same classes against a local 3-master Redis Cluster.
"""
from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import redis
from support.redis_checks import RedisChecks, d
from support.services import service_env
from support.store_contract import StoreContract

from keel.errors import StoreUnavailable
from keel.store.base import (
    Store,
)
from keel.store.redis import RedisStore
from keel.timeline import Assertion

pytestmark = pytest.mark.services

@pytest.fixture(scope="class")
def single_node(request: pytest.FixtureRequest) -> Iterator[None]:
    url = service_env("KEEL_REDIS_URL")
    probe = RedisStore.from_url(url, namespace="probe")
    request.cls.url = url
    request.cls.client = probe.client
    request.cls.cluster = False
    yield
    probe.close()


@pytest.mark.usefixtures("single_node")
class TestRedisStore(RedisChecks, StoreContract):
    """The contract suite and the Redis checks on a single redis-server."""

    def make_store(self) -> Store:
        return self.redis_store()

    def test_from_url_detects_a_single_node(self) -> None:
        s = RedisStore.from_url(self.url, namespace="probe")
        try:
            assert isinstance(s.client, redis.Redis)
        finally:
            s.close()


def test_an_unreachable_server_is_store_unavailable() -> None:
    with pytest.raises(StoreUnavailable):
        RedisStore.from_url("redis://127.0.0.1:1/0", namespace="x", socket_connect_timeout=0.5)
    s = RedisStore.from_url("redis://127.0.0.1:1/0", namespace="x", cluster=False, socket_connect_timeout=0.5)
    with pytest.raises(StoreUnavailable) as caught:
        s.open_fact("acme", "thing:x", "p", 1, valid_from=d(1))
    assert "acme" in str(caught.value) and caught.value.tenant == "acme"
    with pytest.raises(StoreUnavailable):
        list(s.dump("acme"))
    s.close()


def test_assertion_encoding_round_trips() -> None:
    from keel.store.redis import decode_member, decode_point, encode_body, encode_point
    for point in (0, 1, -1, d(0), 2 ** 53 - 1, -(2 ** 53) + 1):
        assert decode_point(encode_point(point)) == point
    points = sorted(random.Random(3).randrange(-(2 ** 53) + 1, 2 ** 53) for _ in range(500))
    assert sorted(points, key=encode_point) == points
    for a in (Assertion(d(1), {"a": [1, None]}, False, None, None, d(1)),
              Assertion(d(1), None, True, "s", "e", d(2), "human:x"),
              Assertion(d(1), "v", True, "s", "e", d(2)),
              Assertion(d(1), -5, False, "s", "e", d(2), None, d(4))):
        rest = encode_point(a.point) + "10" + "11" + "10" + encode_body(a)
        assert decode_member(rest) == (a.point, 0, a.value, a.closed, a.expires_at)
