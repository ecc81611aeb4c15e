"""workers/positioning.py: the group's commit catches up with what Redis holds, and the SIGUSR1 dump.

The hang of the rebalance tier's double join (CI, 4 xdist workers on 2 cores): a worker wrote a partition's last
batch while the partition was revoked, so it did not commit it; the new owner resumed after it (Redis's
watermark), fetched nothing and never committed either: lag stayed above 0 for good, every worker idle and
silent. The services test here builds that end state directly (Redis holds a partition to its end, the
group's commit is behind) and requires the owner to commit it."""
from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, OffsetAndMetadata, TopicPartition
from support.workers import (
    ROOT,
    WorkerProcess,
    keel,
    redis_digests,
    services,
    services_env,
    status,
    unique_cartridge,
    wait_applied,
    wait_until,
)

from keel.cartridge import load_cartridge
from keel.wire import events_topic, group_id
from workers.positioning import COMMIT_RETRY_S, CommitsDue

A, B = TopicPartition("t", 0), TopicPartition("t", 1)


def om(offset: int) -> OffsetAndMetadata:
    return OffsetAndMetadata(offset, "")


def test_a_due_offset_keeps_the_highest_and_a_commit_at_or_past_it_clears_it() -> None:
    due = CommitsDue()
    due.add({A: om(40), B: om(7)})
    due.add({A: om(30)})                       # a lower one never replaces what Redis is known to hold
    assert {tp: o.offset for tp, o in due.offsets.items()} == {A: 40, B: 7}
    due.covered({A: om(39), B: om(9)})         # a batch commit short of A's due offset leaves it due
    assert {tp: o.offset for tp, o in due.offsets.items()} == {A: 40}
    due.covered({A: om(40)})
    assert not due


def test_a_revoked_partition_is_no_longer_due_here() -> None:
    due = CommitsDue()
    due.add({A: om(5), B: om(6)})
    due.revoked({A})
    assert list(due.offsets) == [B]


def test_after_a_failed_attempt_nothing_is_ready_until_the_retry_time() -> None:
    due = CommitsDue()
    due.add({A: om(5)})
    due.not_before = 100.0 + COMMIT_RETRY_S
    assert due.ready(100.0) == {}
    assert due.ready(100.0 + COMMIT_RETRY_S) == {A: om(5)}


def _rewind_group(env: dict[str, str], name: str) -> None:
    """Commit offset 0 for every partition of the group (no member running): Redis now holds what the group's
    commit does not cover, as after a batch written by an owner that lost its partitions before committing."""
    async def go() -> None:
        c = AIOKafkaConsumer(bootstrap_servers=env["KEEL_KAFKA_BOOTSTRAP"], group_id=group_id(name),
                             enable_auto_commit=False)
        await c.start()
        try:
            tps = [TopicPartition(events_topic(name), p) for p in range(8)]
            c.assign(tps)
            await c.commit({tp: 0 for tp in tps})
        finally:
            await c.stop()
    asyncio.run(go())


@services
@pytest.mark.timeout(300)
def test_the_owner_commits_what_redis_holds_beyond_the_groups_commit(tmp_path: Path) -> None:
    env = services_env()
    folder = unique_cartridge(tmp_path, "finance")
    name = load_cartridge(folder).name
    keel("publish", str(folder), str(ROOT / "cartridges" / "finance" / "events.jsonl"), "--quiet", env=env)
    first = WorkerProcess([folder], env, tmp_path / "first.log")
    try:
        ends = {p["partition"]: p["end"] for p in status(folder, env)["partitions"]}
        wait_applied(folder, env, sum(ends.values()), first)
    finally:
        assert first.terminate() == 0
    tenants = list(status(folder, env)["tenants"])
    before = redis_digests(folder, env, tenants)
    _rewind_group(env, name)
    behind = status(folder, env)
    assert behind["lag"] == sum(ends.values()) > 0
    assert all(p["redis_applied"] == p["end"] - 1 for p in behind["partitions"] if p["end"])

    owner = WorkerProcess([folder], env, tmp_path / "owner.log")
    try:
        wait_applied(folder, env, sum(ends.values()), owner)    # lag 0: each partition committed at its end
        doc = status(folder, env)
        assert {p["partition"]: p["committed"] for p in doc["partitions"] if p["end"]} == \
               {p: end for p, end in ends.items() if end}
        assert redis_digests(folder, env, tenants) == before        # nothing applied again
        assert "Redis holds records beyond the group's commit" in owner.text()

        owner.proc.send_signal(signal.SIGUSR1)                      # the operator's dump (workers/diagnose.py)
        wait_until(lambda: "diagnosis on SIGUSR1" in owner.text(), 30, "the SIGUSR1 dump", on_timeout=owner.text)
        dump = owner.text()[owner.text().index("diagnosis on SIGUSR1"):]
        assert "_consume (ingest.py" in dump and "commits due {}" in dump and "paused []" in dump
        assert "LOCAL VARIABLES" not in dump                         # mode's own dump printed frames' locals
        assert owner.alive()
    finally:
        assert owner.terminate() == 0
    assert "Traceback" not in owner.text()
