"""The lag an answer carries, measured when it is made (keel/log_lag.py): the log end of the tenant's partition
minus Redis's applied watermark, on real Kafka and Redis. Issue 22: a stalled pipeline answered with the lag of its
last commit (2,570 reported, 7,149 real)."""
from __future__ import annotations

import uuid

from support.workers import produce_raw, services, services_env, wait_until

from keel.log_lag import LogLag
from keel.store.redis import RedisStore
from keel.wire import partition_for


@services
def test_lag_is_the_log_end_minus_what_redis_holds_and_follows_the_log() -> None:
    env = services_env()
    name = "lag" + uuid.uuid4().hex[:8]
    topic = f"keel.{name}.events"
    tenant = "hogar-a"
    produce_raw(env, topic, [(tenant.encode(), b"{}")] * 30)
    store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=name)
    lag = LogLag(env["KEEL_KAFKA_BOOTSTRAP"], topic, store, ttl_s=0)
    try:
        measured, at = lag.measure(tenant)
        assert measured == 30 and at is not None               # no watermark: nothing of the log is held
        store.advance_partitions({(topic, partition_for(tenant, 8)): 9}, {})
        assert lag.measure(tenant)[0] == 20                    # offsets 10..29 are not applied
        produce_raw(env, topic, [(tenant.encode(), b"{}")] * 5)
        assert lag.measure(tenant)[0] == 25                    # the stalled pipeline's lag grows with the log
        store.advance_partitions({(topic, partition_for(tenant, 8)): 34}, {})
        assert lag.measure(tenant)[0] == 0
    finally:
        lag.close()
        store.drop_namespace()
        store.close()


@services
def test_an_unreachable_log_measures_nothing_and_keeps_the_last_read() -> None:
    env = services_env()
    store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace="lag" + uuid.uuid4().hex[:8])
    lag = LogLag("127.0.0.1:1", "keel.nothing.events", store, ttl_s=0)
    try:
        assert lag.measure("hogar-a") == (None, None)
    finally:
        lag.close()
        store.close()


@services
def test_tool_answers_carry_the_lag_measured_from_the_log_end(tmp_path) -> None:
    from support.workers import unique_cartridge

    import keel
    from keel.cartridge import load_cartridge
    env = services_env()
    folder = unique_cartridge(tmp_path)
    name = load_cartridge(folder).name
    topic = f"keel.{name}.events"
    tenant = "hogar-a"
    produce_raw(env, topic, [(tenant.encode(), b"{}")] * 30)      # 30 records no worker applied
    with keel.open(folder, redis=env["KEEL_REDIS_URL"], kafka=env["KEEL_KAFKA_BOOTSTRAP"]) as graph:
        graph.store.upsert_entity(tenant, "debt", "visa", valid_from="2026-09-01", evidence="e1")
        tools = graph.tools(tenant=tenant)
        answer = tools.context("debt:visa")
        assert answer["lag"] == 30 and "lag_measured_at" not in answer
        graph.store.advance_partitions({(topic, partition_for(tenant, 8)): 19}, {})
        wait_until(lambda: tools.search("visa")["lag"] == 10, 10, "the lag read again (at most once a second)")
        graph.store.drop_namespace()
