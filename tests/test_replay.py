"""`keel replay` on real Kafka and Redis: under live publishing with a worker running, killed midway then
rerun, and after a handler change. Judged by digests against the embedded build of the same events."""
from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
import redis
from support.replay import (
    BackgroundPublisher,
    count_lines,
    finance_file,
    replay_process,
    split_file,
    tenant_keys,
)
from support.workers import (
    WorkerProcess,
    embedded_digests,
    keel,
    redis_digests,
    services_env,
    unique_cartridge,
    wait_applied,
    wait_until,
)

from keel.cartridge import load_cartridge

pytestmark = pytest.mark.services
TARGET = "hogar-a"


@pytest.fixture
def env() -> dict[str, str]:
    return services_env()


def ingest(cartridge: Path, events: Path, env: dict[str, str], log: Path) -> None:
    """Publish `events` and let a worker apply all of them, then stop it."""
    keel("publish", str(cartridge), str(events), "--quiet", env=env)
    worker = WorkerProcess([cartridge], env, log)
    try:
        wait_applied(cartridge, env, count_lines(events), worker)
    finally:
        worker.terminate()


def _only_current_generation(keys: dict[str, object], namespace: str, tenant: str, gen: int) -> None:
    base = f"keel:{{{namespace}/{tenant}}}:"
    stray = [k for k in keys if k not in (base + "gen", base + "gseq") and not k.startswith(f"{base}g{gen}:")]
    assert not stray, f"keys outside generation {gen}: {stray[:10]}"


def test_replay_under_live_publishing_matches_the_embedded_build(tmp_path: Path, env: dict[str, str]) -> None:
    cartridge = unique_cartridge(tmp_path, "finance")
    ns = load_cartridge(cartridge).name
    events = finance_file(tmp_path / "events.jsonl", {TARGET: 6000, "hogar-b": 1500, "hogar-c": 1500})
    quiet = finance_file(tmp_path / "quiet.jsonl", {"hogar-quiet": 300}, seed=99)
    first, *rest = split_file(events, 6)
    keel("publish", str(cartridge), str(quiet), "--quiet", env=env)
    keel("publish", str(cartridge), str(first), "--quiet", env=env)
    worker = WorkerProcess([cartridge], env, tmp_path / "worker.log", "--batch", "500")
    try:
        wait_applied(cartridge, env, count_lines(first) + 300, worker)
        quiet_before = tenant_keys(env["KEEL_REDIS_URL"], ns, "hogar-quiet")
        assert quiet_before
        publisher = BackgroundPublisher(cartridge, rest, env)
        publisher.start()
        out = keel("replay", str(cartridge), "--tenant", TARGET, "--batch", "1000", env=env)
        publisher.join(120)
        assert publisher.error is None, publisher.error
        assert "switched" in out.stdout
        wait_applied(cartridge, env, count_lines(events) + 300, worker)
    finally:
        worker.terminate()
    expected = embedded_digests(load_cartridge(cartridge), events)
    got = redis_digests(cartridge, env, expected)
    assert got == expected
    assert tenant_keys(env["KEEL_REDIS_URL"], ns, "hogar-quiet") == quiet_before   # names and values
    assert redis_digests(cartridge, env, ["hogar-quiet"]) == embedded_digests(load_cartridge(cartridge), quiet)
    for other in ("hogar-b", "hogar-c"):              # written by the worker only, in generation 1
        _only_current_generation(tenant_keys(env["KEEL_REDIS_URL"], ns, other), ns, other, 1)
        assert not any(k.endswith(":gseq") for k in tenant_keys(env["KEEL_REDIS_URL"], ns, other))
    target = tenant_keys(env["KEEL_REDIS_URL"], ns, TARGET)
    _only_current_generation(target, ns, TARGET, 2)


def test_replay_killed_midway_leaves_the_served_graph_and_a_rerun_completes(tmp_path: Path,
                                                                           env: dict[str, str]) -> None:
    cartridge = unique_cartridge(tmp_path, "finance")
    ns = load_cartridge(cartridge).name
    events = finance_file(tmp_path / "events.jsonl", {TARGET: 20000, "hogar-b": 500}, debts=100)
    ingest(cartridge, events, env, tmp_path / "worker.log")
    expected = embedded_digests(load_cartridge(cartridge), events)
    assert redis_digests(cartridge, env, expected) == expected
    served = tenant_keys(env["KEEL_REDIS_URL"], ns, TARGET)
    client = redis.Redis.from_url(env["KEEL_REDIS_URL"])
    marker = f"keel:{{{ns}/{TARGET}}}:replay"
    proc = replay_process(cartridge, env, tmp_path / "replay.log", "--tenant", TARGET, "--batch", "300")
    try:
        # The replay loads 20,000 events in about a second: poll often, and stop it before looking, so that
        # it is killed midway (shadow generation partly filled, not switched) and the test says so if not.
        shadow_ids = f"keel:{{{ns}/{TARGET}}}:g2:m"          # its meta hash counts the event ids applied (`ne`)
        wait_until(lambda: client.exists(marker) and int(client.hget(shadow_ids, "ne") or 0) >= 600
                   or proc.poll() is not None, 60, "the shadow generation to fill", interval=0.005)
        assert proc.poll() is None, (tmp_path / "replay.log").read_text()
        proc.send_signal(signal.SIGSTOP)
        assert client.get(f"keel:{{{ns}/{TARGET}}}:gen") in (None, b"1"), "the replay switched before the kill"
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    after_kill = tenant_keys(env["KEEL_REDIS_URL"], ns, TARGET)
    changed = [k for k, v in served.items() if after_kill.get(k) != v]
    assert not changed, changed                                              # the served generation untouched
    assert client.get(f"keel:{{{ns}/{TARGET}}}:gen") in (None, b"1")
    assert redis_digests(cartridge, env, [TARGET]) == {TARGET: expected[TARGET]}
    time.sleep(0.1)
    out = keel("replay", str(cartridge), "--tenant", TARGET, env=env)
    assert "dropped" in out.stderr and "switched" in out.stdout
    assert redis_digests(cartridge, env, expected) == expected
    keys = tenant_keys(env["KEEL_REDIS_URL"], ns, TARGET)
    current = int(client.get(f"keel:{{{ns}/{TARGET}}}:gen"))
    assert current == 3 and marker not in keys
    _only_current_generation(keys, ns, TARGET, current)
    client.close()


PROJECTION_EDIT = '''      - facts: {set: {month_seen: "{month}"}}
'''


def test_replay_applies_a_changed_handler(tmp_path: Path, env: dict[str, str]) -> None:
    cartridge = unique_cartridge(tmp_path, "finance")
    events = cartridge / "events.jsonl"
    ingest(cartridge, events, env, tmp_path / "worker.log")
    before = embedded_digests(load_cartridge(cartridge), events)
    tenant = next(iter(before))
    assert redis_digests(cartridge, env, [tenant]) == {tenant: before[tenant]}
    catalog = cartridge / "cartridge.yaml"        # debt.snapshot's projection gains a fact
    text = catalog.read_text()
    anchor = '      - link: {relation: owed_by, to: "household:{event.tenant}"}\n'
    assert anchor in text
    catalog.write_text(text.replace(anchor, anchor + PROJECTION_EDIT, 1))
    after = embedded_digests(load_cartridge(cartridge), events)
    assert after[tenant] != before[tenant]
    keel("replay", str(cartridge), "--tenant", tenant, env=env)
    assert redis_digests(cartridge, env, [tenant]) == {tenant: after[tenant]}
    shown = keel("context", str(cartridge), "debt:visa", "--tenant", tenant, "--redis", env["KEEL_REDIS_URL"],
                 "--json", env=env)
    assert "month_seen" in shown.stdout


def test_a_refused_replay_closes_its_consumer(tmp_path: Path, env: dict[str, str]) -> None:
    """Issue 10: a replay refused because a partition lost its oldest records printed "Unclosed
    AIOKafkaConsumer"; the refusal is a usage error (exit 2) and nothing is left open."""
    import asyncio

    from aiokafka import TopicPartition
    from aiokafka.admin import RecordsToDelete

    from keel.kafka import admin_client
    from keel.wire import events_topic
    from workers.replay_scan import tenant_partition
    folder = unique_cartridge(tmp_path, "finance")
    keel("publish", str(folder), str(folder / "events.jsonl"), env=env)
    name = load_cartridge(folder).name
    tenant = "hogar-demo"

    async def trim() -> None:
        async with admin_client(env["KEEL_KAFKA_BOOTSTRAP"]) as admin:
            [described] = await admin.describe_topics([events_topic(name)])
            tp = TopicPartition(events_topic(name), tenant_partition(tenant, len(described["partitions"])))
            await admin.delete_records({tp: RecordsToDelete(before_offset=1)})
    asyncio.run(trim())
    out = keel("replay", str(folder), "--tenant", tenant, "--quiet", env=env, check=False)
    assert out.returncode == 2 and "retention.ms=-1" in out.stderr
    assert "Unclosed" not in out.stderr
