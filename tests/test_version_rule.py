"""One version rule (keel.timeline), mirrored by the Redis VIEW script's Lua `winner_at`: on random timelines
(same-point corrections, ends, expiries, late knowledge) the Redis store's as-of answers, computed in Lua,
equal Timeline.as_of computed in Python, at every interesting time."""
from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.services import service_env

from keel.store.base import fact_result
from keel.store.redis import RedisStore
from keel.timeline import Assertion, Timeline

pytestmark = pytest.mark.services

DAY = 86_400_000_000
T0 = 1_788_220_800_000_000          # 2026-09-01
TENANT, ENTITY = "acme", "thing:one"
KEY = ("f", ENTITY, "p", "")

assertions = st.lists(st.tuples(st.integers(0, 8),                    # point (days)
                                st.booleans(),                       # an end?
                                st.integers(0, 5),                   # value
                                st.sampled_from([None, "human:x"]),  # by
                                st.one_of(st.none(), st.integers(1, 4))),   # expires after (days)
                      min_size=1, max_size=12)


@pytest.fixture(scope="module")
def redis_store() -> Iterator[RedisStore]:
    store = RedisStore.from_url(service_env("KEEL_REDIS_URL"), namespace=f"v{uuid.uuid4().hex[:12]}")
    yield store
    store.drop_namespace()
    store.close()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(ops=assertions)
def test_lua_and_python_agree_on_the_version_at_every_time(redis_store: RedisStore,
                                                           ops: list[tuple[int, bool, int, str | None, int | None]]
                                                           ) -> None:
    redis_store.drop_tenant(TENANT)
    tl = Timeline()
    for i, (d, closed, value, by, expires) in enumerate(ops):
        point = T0 + d * DAY
        a = Assertion(point, None if closed else value, closed, f"src{i}", f"ev{i}", T0 + i, by,
                      None if closed or expires is None else point + expires * DAY)
        tl.add(a)
        redis_store.apply_writes(TENANT, [(KEY, a)])
    for d in range(-1, 14):
        for at in (T0 + d * DAY - 1, T0 + d * DAY, T0 + d * DAY + 1):
            version = tl.as_of(at)
            expected = [] if version is None else [fact_result(KEY, version)]
            assert redis_store.facts(TENANT, ENTITY, at=at) == expected, (d, at)
