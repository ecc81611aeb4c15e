"""Generations on Redis: the cutover a replay uses, and strict writers noticing it."""
from __future__ import annotations

import uuid

import pytest

from keel import reading
from keel.store.base import fact_write
from keel.store.redis import GenerationChanged, RedisStore

pytestmark = pytest.mark.services
T = "acme"


def write(i: int):
    return fact_write("thing:one", "p", i, f"2026-09-{i:02d}", False, source="s", evidence=f"e{i}",
                      recorded_at=None, by=None)


@pytest.fixture
def stores(redis_url: str):
    ns = f"gen{uuid.uuid4().hex[:10]}"
    live = RedisStore.from_url(redis_url, namespace=ns, strict_generations=True)
    admin = RedisStore.from_url(redis_url, namespace=ns)
    yield live, admin
    admin.drop_namespace()
    live.close()
    admin.close()


def test_switch_waits_until_the_shadow_caught_up(stores) -> None:
    live, admin = stores
    live.commit_batch(T, [([write(1)], "e1"), ([write(2)], "e2")], ("topic", 0, 41))
    gen = admin.new_generation(T)
    shadow = admin.for_generation(T, gen)
    shadow.commit_batch(T, [([write(1)], "e1")], ("topic", 0, 20))
    behind = admin.switch_when_caught_up(T, 1, gen, [("topic", 0)])
    assert isinstance(behind, str) and "topic" in behind                        # shadow at 20, live at 41
    assert admin.current_generation(T) == 1
    shadow.commit_batch(T, [([write(2)], "e2")], ("topic", 0, 41))
    assert admin.switch_when_caught_up(T, 2, gen, [("topic", 0)]) is False      # expected generation wrong
    assert admin.switch_when_caught_up(T, 1, gen, [("topic", 0)]) is True
    assert admin.current_generation(T) == gen
    assert [f["value"] for f in reading.history(admin, T, "thing:one")] == [1, 2]


def test_a_strict_writer_learns_of_the_cutover_instead_of_writing_into_it(stores) -> None:
    live, admin = stores
    live.commit_batch(T, [([write(1)], "e1")], ("topic", 0, 1))
    assert live.has_event(T, "e1")            # the writer has read generation 1
    gen = admin.new_generation(T)
    admin.for_generation(T, gen).commit_batch(T, [([write(1)], "e1")], ("topic", 0, 1))
    assert admin.switch_when_caught_up(T, 1, gen, [("topic", 0)]) is True
    with pytest.raises(GenerationChanged) as e:
        live.commit_batch(T, [([write(3)], "e3")], ("topic", 0, 2))
    assert (e.value.old, e.value.new, e.value.tenant) == (1, gen, T)
    live.commit_batch(T, [([write(3)], "e3")], ("topic", 0, 2))       # planned again: now it goes through
    assert admin.applied_offset(T, "topic", 0) == 2 and admin.has_event(T, "e3")
    assert admin.drop_generation(T, 1) > 0
