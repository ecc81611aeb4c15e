"""The late-commit race against real PostgreSQL and Kafka: many concurrent writer transactions with random
delays before commit, some rolled back, while the relay runs. Every committed row reaches the topic at least
once, no rolled-back row ever does, each tenant's events keep outbox order; the same when the relay is killed
-9 and restarted mid-stream; and the worker builds from the topic the graph the embedded build gives."""
from __future__ import annotations

import json
import random
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from common import finance_events
from support.outbox import (
    committed_rows,
    first_occurrences_by_tenant,
    fresh_schema,
    ingress_cli,
    ingress_env,
    insert,
    read_topic,
    relay_caught_up,
    relay_process,
    services,
    unique_cartridge,
    wait_until,
)

from keel.cartridge import load_cartridge
from keel.errors import KeelError

pytestmark = [services, pytest.mark.timeout(600)]


@pytest.fixture
def env() -> dict[str, str]:
    return ingress_env()


@pytest.fixture
def schema(env: dict[str, str]) -> Iterator[str]:
    yield from fresh_schema(env["KEEL_POSTGRES_DSN"])


class Writers:
    """Concurrent product transactions writing envelopes to the outbox: 1–4 per transaction, a random pause
    before the end (a few long ones), 15% rolled back."""

    def __init__(self, dsn: str, schema: str, envelopes: list[dict[str, Any]], threads: int, seed: int) -> None:
        self.dsn = dsn
        self.schema = schema
        rng = random.Random(seed)
        self.chunks: list[list[dict[str, Any]]] = []
        i = 0
        while i < len(envelopes):
            n = rng.randint(1, 4)
            self.chunks.append(envelopes[i:i + n])
            i += n
        self.chunks.reverse()
        self.committed: list[str] = []
        self.rolled_back: list[str] = []
        self.errors: list[BaseException] = []
        self.done = 0
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._run, args=(seed + k,), daemon=True) for k in range(threads)]

    def start(self) -> Writers:
        for t in self._threads:
            t.start()
        return self

    def join(self, timeout: float = 300) -> None:
        for t in self._threads:
            t.join(timeout)
        assert not self.errors, self.errors

    def alive(self) -> bool:
        return any(t.is_alive() for t in self._threads)

    def _run(self, seed: int) -> None:
        rng = random.Random(seed)
        try:
            with psycopg.connect(self.dsn) as conn:
                while True:
                    with self._lock:
                        if not self.chunks:
                            return
                        chunk = self.chunks.pop()
                    for e in chunk:
                        insert(conn, self.schema, e)
                        time.sleep(rng.uniform(0, 0.003))
                    time.sleep(rng.uniform(0.3, 1.0) if rng.random() < 0.03 else rng.uniform(0, 0.03))
                    ids = [e["id"] for e in chunk]
                    if rng.random() < 0.15:
                        conn.rollback()
                        with self._lock:
                            self.rolled_back += ids
                    else:
                        conn.commit()
                        with self._lock:
                            self.committed += ids
                    with self._lock:
                        self.done += len(chunk)
        except BaseException as e:  # noqa: BLE001 - reported by join()
            self.errors.append(e)


class Straggler(threading.Thread):
    """One transaction that writes first (lowest positions) and ends last: the trap a position cursor falls in."""

    def __init__(self, dsn: str, schema: str, envelopes: list[dict[str, Any]], hold_s: float, commit: bool) -> None:
        super().__init__(daemon=True)
        self.dsn, self.schema, self.envelopes, self.hold_s, self.commit = dsn, schema, envelopes, hold_s, commit
        self.written = threading.Event()

    def run(self) -> None:
        with psycopg.connect(self.dsn) as conn:
            for e in self.envelopes:
                insert(conn, self.schema, e)
            self.written.set()
            time.sleep(self.hold_s)
            conn.commit() if self.commit else conn.rollback()


class NaiveTail(threading.Thread):
    """The control: a reader with a `position > last seen` cursor, polling like a naive relay would."""

    def __init__(self, dsn: str, schema: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.schema = dsn, schema
        self.seen: set[str] = set()
        self.stop = threading.Event()

    def run(self) -> None:
        last = 0
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            while not self.stop.is_set():
                rows = conn.execute(f"SELECT position, envelope->>'id' FROM {self.schema}.keel_outbox "
                                    f"WHERE position > %s ORDER BY position", (last,)).fetchall()
                for position, ident in rows:
                    self.seen.add(ident)
                    last = max(last, position)
                time.sleep(0.02)


def generated(n: int, tenants: int, seed: int) -> list[dict[str, Any]]:
    """Finance envelopes with recorded_at set (so the embedded build of the committed ones is the oracle)."""
    return [{**e, "recorded_at": e["occurred_at"]} for e in finance_events(n, tenants, seed=seed)]


def run_race(env: dict[str, str], schema: str, folder: Path, tmp_path: Path, *, n: int, kills: int,
             seed: int) -> tuple[list[str], list[str], list[Any], set[str]]:
    """Write n envelopes concurrently while the relay runs (killed -9 and restarted `kills` times); returns
    (committed ids, rolled-back ids, records on the events topic once the relay caught up, ids a naive
    position-cursor reader saw)."""
    dsn = env["KEEL_POSTGRES_DSN"]
    cartridge = load_cartridge(folder)
    ingress_cli("outbox", "init", "--schema", schema, env=env)
    envelopes = generated(n, 12, seed)
    early, late, rest = envelopes[:3], envelopes[3:5], envelopes[5:]
    relay = relay_process(folder, schema, env, tmp_path / "relay-0.log", "--batch", "50")
    naive = NaiveTail(dsn, schema)
    naive.start()
    hold = 1.0 if kills else 4.0              # with kills, let rows flow soon so the kills land mid-stream
    stragglers = [Straggler(dsn, schema, early, hold_s=hold, commit=True),
                  Straggler(dsn, schema, late, hold_s=hold / 2, commit=False)]
    for s in stragglers:
        s.start()
        s.written.wait(10)
    writers = Writers(dsn, schema, rest, threads=8, seed=seed).start()
    rng = random.Random(seed)
    for k in range(kills):
        relay.wait_for_line(r"from cursor", timeout=60)
        time.sleep(rng.uniform(0.3, 1.5))
        relay.kill()
        relay = relay_process(folder, schema, env, tmp_path / f"relay-{k + 1}.log", "--batch", "50")
    writers.join()
    for s in stragglers:
        s.join(30)
    time.sleep(0.5)
    naive.stop.set()
    naive.join(10)
    committed = writers.committed + [e["id"] for e in early]
    rolled_back = writers.rolled_back + [e["id"] for e in late]
    try:
        wait_until(lambda: relay_caught_up(dsn, schema, cartridge.name), 120, "the relay to catch up",
                   on_timeout=relay.text)
        relay.wait_for_line(r"from cursor", timeout=60)
        assert relay.terminate() == 0                                  # SIGTERM: graceful
    finally:
        if relay.alive():
            relay.kill()
    wanted = set(committed)
    records = read_topic(env["KEEL_KAFKA_BOOTSTRAP"], cartridge.topic,
                         until=lambda rs: wanted <= {json.loads(r.value)["id"] for r in rs}, timeout=90)
    return committed, rolled_back, records, naive.seen


def check_topic(env: dict[str, str], schema: str, committed: list[str], rolled_back: list[str],
                records: list[Any]) -> None:
    on_topic = [json.loads(r.value) for r in records]
    ids = {e["id"] for e in on_topic}
    assert rolled_back and committed
    assert ids == set(committed), (f"missing {sorted(set(committed) - ids)[:10]}, "
                                   f"never committed {sorted(ids - set(committed))[:10]}")
    assert not ids & set(rolled_back)
    assert all(r.key == json.loads(r.value)["tenant"].encode() for r in records)
    rows = committed_rows(env["KEEL_POSTGRES_DSN"], schema)
    assert first_occurrences_by_tenant(on_topic) == first_occurrences_by_tenant(rows)   # outbox order per tenant


def retrying(step: Callable[[], None], seconds: float = 60) -> None:
    """Run a step, again while Kafka answers with a KeelError (a fresh broker's group coordinator comes up
    a few seconds after the first group asks for it)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            step()
            return
        except KeelError:
            if time.monotonic() > deadline:
                raise
            time.sleep(1)


def test_late_commits_are_never_skipped_and_rollbacks_never_published(env: dict[str, str], schema: str,
                                                                       tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    committed, rolled_back, records, naive = run_race(env, schema, folder, tmp_path, n=2500, kills=0, seed=11)
    check_topic(env, schema, committed, rolled_back, records)
    assert len(records) == len(committed)             # no crash, so no duplicate either
    skipped = set(committed) - naive
    assert skipped, "the control reader skipped nothing: the race did not happen"
    print(f"a position cursor would have skipped {len(skipped)} of {len(committed)} committed rows")


def test_relay_killed_and_restarted_mid_stream_skips_nothing(env: dict[str, str], schema: str,
                                                             tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    committed, rolled_back, records, _ = run_race(env, schema, folder, tmp_path, n=4000, kills=4, seed=23)
    check_topic(env, schema, committed, rolled_back, records)
    assert len(records) >= len(committed)             # at least once: a kill may re-send a batch
    starts = set()
    for k in range(1, 5):
        found = re.search(r"from cursor (\d+):(\d+)", (tmp_path / f"relay-{k}.log").read_text())
        assert found, f"relay {k} did not start"
        starts.add((int(found.group(1)), int(found.group(2))))
    assert len(starts - {(0, 0)}) >= 2, f"the kills did not land mid-stream: restarts from {sorted(starts)}"
    print(f"relay restarted from cursors {sorted(starts)}; {len(records) - len(committed)} duplicate(s) on the topic")


def test_the_worker_builds_from_the_relayed_topic_the_embedded_graph(env: dict[str, str], schema: str,
                                                                      tmp_path: Path) -> None:
    from support.services import service_env
    from support.workers import WorkerProcess, embedded_digests, keel, redis_digests, wait_applied
    full = {**env, "KEEL_REDIS_URL": service_env("KEEL_REDIS_URL")}
    folder = unique_cartridge(tmp_path)
    committed, rolled_back, records, _ = run_race(env, schema, folder, tmp_path, n=1500, kills=1, seed=37)
    check_topic(env, schema, committed, rolled_back, records)
    oracle = tmp_path / "committed.jsonl"
    oracle.write_text("".join(json.dumps(e) + "\n" for e in committed_rows(env["KEEL_POSTGRES_DSN"], schema)))
    expected = embedded_digests(load_cartridge(folder), oracle)
    worker = WorkerProcess([folder], full, tmp_path / "worker.log")
    try:
        retrying(lambda: wait_applied(folder, full, len(records), worker))
        assert redis_digests(folder, full, expected) == expected
        tenant = min(expected)
        out = keel("digest", str(folder), "--tenant", tenant, "--redis", full["KEEL_REDIS_URL"], env=full)
        assert out.stdout.strip() == expected[tenant]
        assert worker.terminate() == 0
    finally:
        worker.kill()
