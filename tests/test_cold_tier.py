"""The cold tier (keel/cold_pg.py, keel/store/redis/cold.py, workers/archive.py) against real Redis and
PostgreSQL: closed segments moved to PostgreSQL answer every read exactly as when they were in Redis
(digests equal to the embedded build); generations, tenants and namespaces dropped take their cold rows along;
a mover killed -9 mid-move loses and doubles nothing; PostgreSQL down (a private server, stopped and started)
stops only the reads that need cold history, with ColdTierUnavailable, and the mover resumes by itself."""
from __future__ import annotations

import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis
from support.private_pg import private_postgres
from support.services import service_env
from support.workers import (
    ROOT,
    WorkerProcess,
    embedded_digests,
    keel,
    read_topic,
    redis_digests,
    unique_cartridge,
    wait_applied,
    wait_until,
)
from test_privacy_kafka import keyed_env as keyed  # noqa: F401 - the fixture: Kafka, Redis, master key, key store

from keel.cartridge import Cartridge, load_cartridge
from keel.cold_pg import TABLE, ColdStore
from keel.digest import digest
from keel.embedded import build_embedded
from keel.errors import ColdTierNotConfigured, ColdTierUnavailable, UsageError
from keel.store.redis import RedisStore
from keel.store.redis.cold import CHANGES_MOVED, COLD, Piece, candidates
from keel.store.redis.keys import layout_key
from keel.tools import Tools
from workers.archive import ArchiveOptions, Mover, open_with_cold_tier, set_policy

pytestmark = [pytest.mark.services, pytest.mark.timeout(300)]
FINANCE = ROOT / "cartridges" / "finance"
TENANT = "acme"


class _Rolling(RedisStore):
    roll_bytes = 1500         # many closed segments from a short history


class _CountingCold(ColdStore):
    """The real cold store, counting the pieces reads ask it for (a read must fetch only what the index names)."""

    def __init__(self, dsn: str) -> None:
        super().__init__(dsn)
        self.fetched: list[Piece] = []

    def fetch(self, namespace: str, tenant: str, gen: int, pieces: Sequence[Piece]) -> dict[Piece, str]:
        self.fetched += pieces
        return super().fetch(namespace, tenant, gen, pieces)


def daily_history(path: Path, days: int, debts: int = 3, tenant: str = TENANT) -> Path:
    """A snapshot of each debt every day (its balance and rate change daily), and a due paid each month (a
    relation starting at the payment day): long timelines with many versions."""
    start = dt.date(2024, 1, 1)
    lines = []
    for d in range(days):
        day = (start + dt.timedelta(days=d)).isoformat()
        for k in range(debts):
            lines.append({"id": f"snap-{k}-{d}", "tenant": tenant, "type": "debt.snapshot", "subject": f"debt:d{k}",
                          "occurred_at": day, "payload": {"creditor": "Banco", "product": f"P{k}",
                                                          "balance_cop": 5_000_000 - 1000 * d - k,
                                                          "rate_ea_pct": 20 + d % 7, "installment_cop": 50_000,
                                                          "month": day[:7]}})
        if d % 30 == 5:
            lines.append({"id": f"due-{d}", "tenant": tenant, "type": "due.scheduled", "subject": f"due:d0-{d}",
                          "occurred_at": day, "payload": {"debt_id": "d0", "due_on": day, "amount_cop": 50_000}})
            lines.append({"id": f"paid-{d}", "tenant": tenant, "type": "due.paid", "subject": f"due:d0-{d}",
                          "occurred_at": day, "payload": {"paid_on": day, "amount_cop": 50_000,
                                                          "account_id": "main", "movement_id": f"m{d}"}})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture
def cold_dsn() -> Iterator[str]:
    """A private schema of the shared PostgreSQL (dropped at the end; nothing shared is touched)."""
    dsn = service_env("KEEL_POSTGRES_DSN")
    schema = f"cold_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield dsn + ("&" if "?" in dsn else "?") + f"options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {schema} CASCADE")


def _stamped(url: str, namespace: str, cls: type[RedisStore] = _Rolling) -> RedisStore:
    """A store of a new namespace, stamped by the opening (so that every process opens it)."""
    probe = RedisStore.from_url(url, namespace=namespace)
    return cls(probe.client, namespace=namespace)


def _answers(cartridge: Cartridge, store: Any, tenant: str = TENANT, changes: bool = True) -> str:
    """Reads of every kind, now and in the past, believed now and earlier, as one JSON text (`changes`: with the
    tenant's changes, whose cursor names the generation)."""
    t = Tools(cartridge, store, tenant)
    out: list[Any] = []
    for e in ("debt:d0", "debt:d2", "due:d0-35"):
        out.append(t.context(e))
        out.append(t.history(e))
        for at in ("2024-01-03", "2024-02-01", "2024-03-17", "2024-04-20"):
            out.append(t.context(e, at=at))
            out.append(t.context(e, at=at, known_at="2024-03-01"))
            out.append(t.related(e, at=at))
        out.append(t.history(e, "amount_cop" if e.startswith("due") else "balance_cop", known_at="2024-02-15"))
    out.append(t.related("account:main", at="2024-03-01"))
    out.append(t.search("P1", at="2024-02-01"))
    out.append(t.search("Banco", at="2024-03-01", known_at="2024-02-01"))
    if changes:
        out.append(t.history(since="2024-01-01", limit=500))
    return json.dumps(out, sort_keys=True, default=str)


def _pass(cartridge: Cartridge, store: RedisStore) -> Any:
    return Mover(cartridge, store, ArchiveOptions(once=True, quiet=True, batch=7)).pass_once()


def _rows(dsn: str, namespace: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (TABLE,)).fetchone()
        if exists is None or exists[0] is None:            # not created yet: the mover creates it
            return 0
        row = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE namespace = %s", (namespace,)).fetchone()
    return int(row[0]) if row else 0


def _cold_fields(store: RedisStore, tenant: str) -> int:
    """The closed segments the generation's cold hash records (less its change-log marker `ch`)."""
    gen = store.current_generation(tenant)
    return int(store.client.hlen(store.data_prefix(tenant, gen) + COLD)) - int(
        store.client.hexists(store.data_prefix(tenant, gen) + COLD, CHANGES_MOVED))


def test_reads_answer_the_same_with_closed_history_in_postgresql(tmp_path: Path, cold_dsn: str) -> None:
    cartridge = load_cartridge(FINANCE)
    events = daily_history(tmp_path / "history.jsonl", 120)
    store = _stamped(service_env("KEEL_REDIS_URL"), f"cold{uuid.uuid4().hex[:10]}")
    cold = _CountingCold(cold_dsn)
    store.cold = cold
    try:
        assert not build_embedded(cartridge, events, store=store)[1].rejected
        before = _answers(cartridge, store)
        expected = embedded_digests(cartridge, events)[TENANT]
        assert digest(store, TENANT) == expected
        gen = store.current_generation(TENANT)
        closed = candidates(store, TENANT, gen)
        assert len(closed) > 20                                  # a long history: many closed segments

        report = _pass(cartridge, store)                          # the cartridge says never: nothing moves
        assert report.moved == 0 and report.waiting == 0
        set_policy(store, "30d")
        report = _pass(cartridge, store)
        assert report.moved == len(closed) == _rows(cold_dsn, store.namespace) == _cold_fields(store, TENANT)
        assert not candidates(store, TENANT, gen)
        assert not any(store.client.exists(f"{store.data_prefix(TENANT, gen)}s:{c.entity}|{c.n}") for c in closed)

        cold.fetched.clear()
        assert _answers(cartridge, store) == before                # byte-identical answers
        assert digest(store, TENANT) == expected                   # and the digest of the embedded build
        assert cold.fetched                                        # the reads above did need cold history

        cold.fetched.clear()                                       # a read now needs nothing cold
        Tools(cartridge, store, TENANT).context("debt:d1")
        assert cold.fetched == []
        Tools(cartridge, store, TENANT).context("debt:d1", at="2024-02-10")   # a past read: the pieces named
        assert 0 < len(cold.fetched) <= 3, cold.fetched

        assert _pass(cartridge, store).moved == 0                  # a second pass has nothing to do
    finally:
        store.drop_namespace()
        assert _rows(cold_dsn, store.namespace) == 0
        store.close()


def test_without_the_cold_tier_present_reads_go_on_and_the_rest_is_refused(tmp_path: Path, cold_dsn: str) -> None:
    cartridge = load_cartridge(FINANCE)
    events = daily_history(tmp_path / "history.jsonl", 90)
    url = service_env("KEEL_REDIS_URL")
    store = _stamped(url, f"cold{uuid.uuid4().hex[:10]}")
    store.cold = ColdStore(cold_dsn)
    bare = _Rolling(redis.Redis.from_url(url, decode_responses=True), namespace=store.namespace)
    try:
        build_embedded(cartridge, events, store=store)
        set_policy(store, "1d")
        assert _pass(cartridge, store).moved > 0
        assert Tools(cartridge, bare, TENANT).context("debt:d0") == Tools(cartridge, store, TENANT).context("debt:d0")
        with pytest.raises(ColdTierNotConfigured, match="KEEL_COLD_DSN"):
            Tools(cartridge, bare, TENANT).context("debt:d0", at="2024-01-20")
        gen = bare.new_generation(TENANT)
        bare.switch_generation(TENANT, gen)
        with pytest.raises(ColdTierNotConfigured):                 # its rows would stay behind
            bare.drop_generation(TENANT, gen - 1)
    finally:
        bare.close()
        store.drop_namespace()
        store.close()


def test_generation_tenant_and_namespace_drops_delete_their_cold_rows(tmp_path: Path, cold_dsn: str) -> None:
    cartridge = load_cartridge(FINANCE)
    events = daily_history(tmp_path / "history.jsonl", 90)
    store = _stamped(service_env("KEEL_REDIS_URL"), f"cold{uuid.uuid4().hex[:10]}")
    store.cold = ColdStore(cold_dsn)
    expected = embedded_digests(cartridge, events)[TENANT]
    try:
        build_embedded(cartridge, events, store=store)
        build_embedded(cartridge, daily_history(tmp_path / "other.jsonl", 90, tenant="other"), store=store)
        set_policy(store, "1d")
        _pass(cartridge, store)
        old = store.current_generation(TENANT)
        before = _rows(cold_dsn, store.namespace)
        assert before > 0

        gen = store.new_generation(TENANT)                         # what a replay does: build, cut over, drop
        build_embedded(cartridge, events, store=store.for_generation(TENANT, gen))
        store.switch_generation(TENANT, gen)
        store.drop_generation(TENANT, old)
        with psycopg.connect(cold_dsn, autocommit=True) as conn:
            gens = {r[0] for r in conn.execute(f"SELECT DISTINCT generation FROM {TABLE} WHERE tenant = %s",
                                               (TENANT,)).fetchall()}
        assert gens == set()                                      # the old generation's rows are gone
        assert _pass(cartridge, store).moved > 0                  # the new generation's segments move in turn
        assert digest(store, TENANT) == expected

        store.drop_tenant(TENANT)                                  # offboarding drops the tenant
        with psycopg.connect(cold_dsn, autocommit=True) as conn:
            left = conn.execute(f"SELECT DISTINCT tenant FROM {TABLE}").fetchall()
        assert left == [("other",)]
    finally:
        store.drop_namespace()
        assert _rows(cold_dsn, store.namespace) == 0
        store.close()


def test_archive_refuses_a_layout_1_namespace_with_one_line(tmp_path: Path, cold_dsn: str) -> None:
    folder = unique_cartridge(tmp_path)
    cartridge = load_cartridge(folder)
    url = service_env("KEEL_REDIS_URL")
    probe = RedisStore.from_url(url, namespace=cartridge.name)
    probe.client.set(layout_key(cartridge.name), 1)          # a namespace of the removed layout 1
    probe.close()
    env = {"KEEL_REDIS_URL": url, "KEEL_COLD_DSN": cold_dsn}
    try:
        with pytest.raises(UsageError, match=r"keel replay <cartridge folder> --all"):
            from keel.config import resolve
            open_with_cold_tier(cartridge, resolve({}, env))
        proc = keel("archive", str(folder), "--once", env=env, check=False)
        assert proc.returncode == 2
        assert proc.stderr.strip().splitlines()[-1].endswith("see CHANGELOG.md"), proc.stderr
    finally:
        store = RedisStore.from_url(url, namespace=cartridge.name, upgrading_layout=True)
        store.drop_namespace()
        store.close()


def test_a_mover_killed_mid_move_loses_and_doubles_nothing(tmp_path: Path, cold_dsn: str) -> None:
    folder = unique_cartridge(tmp_path)
    cartridge = load_cartridge(folder)
    events = daily_history(tmp_path / "history.jsonl", 200)
    url = service_env("KEEL_REDIS_URL")
    store = _stamped(url, cartridge.name)
    store.cold = ColdStore(cold_dsn)
    env = {"KEEL_REDIS_URL": url, "KEEL_COLD_DSN": cold_dsn}
    try:
        build_embedded(cartridge, events, store=store)
        before = _answers(cartridge, store)
        expected = embedded_digests(cartridge, events)[TENANT]
        total = len(candidates(store, TENANT, store.current_generation(TENANT)))
        set_policy(store, "1d")
        mover = subprocess.Popen([sys.executable, "-m", "keel.cli", "archive", str(folder), "--once", "--batch", "1"],
                                 env={**os.environ, **env}, cwd=ROOT, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: _rows(cold_dsn, cartridge.name) >= 3 or mover.poll() is not None, 120,
                       "the mover's first copies", interval=0.01)
            mover.send_signal(signal.SIGKILL)
        finally:
            mover.wait(30)
        copied, cold = _rows(cold_dsn, cartridge.name), _cold_fields(store, TENANT)
        assert mover.returncode == -signal.SIGKILL and copied < total   # killed while it was moving
        assert cold <= copied                                      # no segment deleted before its copy
        assert _answers(cartridge, store) == before                # nothing lost, wherever it was killed
        keel("archive", str(folder), "--once", env=env)            # a rerun completes
        assert _rows(cold_dsn, cartridge.name) == _cold_fields(store, TENANT) == total
        assert not candidates(store, TENANT, store.current_generation(TENANT))
        assert _answers(cartridge, store) == before
        assert digest(store, TENANT) == expected
        doc = json.loads(keel("status", str(folder), "--json", env={**env, "KEEL_KAFKA_BOOTSTRAP":
                                                                   service_env("KEEL_KAFKA_BOOTSTRAP")},
                              check=False).stdout)
        assert doc["cold_tier"]["cold_rows"] == total and doc["cold_tier"]["waiting"] == 0
        assert doc["cold_tier"]["hot_closed"] == 0 and "error" not in doc["cold_tier"]
    finally:
        store.drop_namespace()
        store.close()


def test_postgresql_down_stops_only_cold_reads_and_the_mover_resumes(tmp_path: Path) -> None:
    folder = unique_cartridge(tmp_path)
    cartridge = load_cartridge(folder)
    first = daily_history(tmp_path / "first.jsonl", 60)
    url = service_env("KEEL_REDIS_URL")
    with private_postgres() as pg:
        store = _stamped(url, cartridge.name)
        store.cold = ColdStore(pg.dsn, connect_timeout=2)
        try:
            build_embedded(cartridge, first, store=store)
            set_policy(store, "1d")
            assert _pass(cartridge, store).moved > 0
            now = Tools(cartridge, store, TENANT).context("debt:d0")
            past = Tools(cartridge, store, TENANT).context("debt:d0", at="2024-01-20")

            pg.stop()
            assert Tools(cartridge, store, TENANT).context("debt:d0") == now          # the present goes on
            with pytest.raises(ColdTierUnavailable, match="cold tier"):
                Tools(cartridge, store, TENANT).context("debt:d0", at="2024-01-20")
            env = {"KEEL_REDIS_URL": url, "KEEL_COLD_DSN": pg.dsn, "KEEL_KAFKA_BOOTSTRAP":
                   service_env("KEEL_KAFKA_BOOTSTRAP")}
            query = ["context", str(folder), "--redis", url, "--tenant", TENANT, "debt:d0", "--json"]
            assert json.loads(keel(*query, env=env).stdout)["facts"] == now["facts"]      # the CLI, now: exit 0
            refused = keel(*query, "--at", "2024-01-20", env=env, check=False)
            assert refused.returncode == 3 and "cold tier (PostgreSQL)" in refused.stderr, refused.stderr
            more = daily_history(tmp_path / "more.jsonl", 120)                       # new closed segments
            build_embedded(cartridge, more, store=store)
            mover = Mover(cartridge, store, ArchiveOptions(interval_s=0.2, quiet=True))
            thread = threading.Thread(target=mover.run)
            thread.start()
            try:
                wait_until(lambda: bool(store.client.hget(f"keel:{{{store.namespace}}}:cold", "error")), 120,
                           "the mover recording PostgreSQL's outage")
                pg.start()
                wait_until(lambda: not store.client.hexists(f"keel:{{{store.namespace}}}:cold", "error")
                           and not candidates(store, TENANT, store.current_generation(TENANT)), 120,
                           "the mover resuming once PostgreSQL is back")
            finally:
                mover.stopping.set()
                thread.join(60)
            again = Tools(cartridge, store, TENANT).context("debt:d0", at="2024-01-20")
            assert {**again, "known_through": None} == {**past, "known_through": None}   # (more was ingested)
            assert digest(store, TENANT) == embedded_digests(cartridge, more)[TENANT]
        finally:
            store.drop_namespace()
            store.close()


@pytest.mark.usefixtures("keyed")
def test_erasure_leaves_no_erased_value_in_the_cold_tier(tmp_path: Path, request: pytest.FixtureRequest,
                                                         cold_dsn: str) -> None:
    """A subject's values in closed segments moved to PostgreSQL; `keel erase --redis` rebuilds the tenant (a
    replay: new generation, old one dropped with its cold rows): none of its values stays in PostgreSQL, and
    once the new generation's segments are archived in turn PostgreSQL holds only the mask."""
    from test_privacy import SECRET_NAME, STREAM, masked, write_lines
    from test_privacy_kafka import ERASED_VALUES, unique_clinic

    from keel.wire import events_topic
    env = {**request.getfixturevalue("keyed"), "KEEL_COLD_DSN": cold_dsn}
    folder = unique_clinic(tmp_path)
    cartridge = load_cartridge(folder)
    start = dt.datetime(2026, 2, 1, 10)
    renamed = [{"id": f"r{i}", "tenant": "t1", "type": "client.registered", "subject": "client:c1",
                "occurred_at": (start + dt.timedelta(days=i)).strftime("%Y-%m-%dT%H:%M:%SZ"),
                "payload": {"name": f"{SECRET_NAME} #{i}", "phone": f"+57 300 555 {i:04d}"}} for i in range(150)]
    stream = [*STREAM, *renamed]
    clear = write_lines(tmp_path / "clear.jsonl", stream)
    keel("publish", str(folder), str(clear), "--partitions", "2", env=env)
    worker = WorkerProcess([folder], env, tmp_path / "worker.log")
    try:
        wait_applied(folder, env, len(stream), worker)
        keel("archive", str(folder), "--set-cold-after", "1d", env=env)
        keel("archive", str(folder), "--once", env=env)
        cold = ColdStore(cold_dsn)
        try:
            assert cold.sizes(cartridge.name)[0] > 0
            assert cold.values_like(cartridge.name, SECRET_NAME) > 0       # the subject's history went cold
            keel("erase", str(folder), "--redis", env["KEEL_REDIS_URL"], "--kafka", env["KEEL_KAFKA_BOOTSTRAP"],
                 "--tenant", "t1", "--subject", "client:c1", env=env)
            wait_applied(folder, env, len(stream) + 1, worker)
            secrets = [*ERASED_VALUES, *(f"{SECRET_NAME} #{i}" for i in range(150)), "+57 300 555 0149"]
            assert [v for v in secrets if cold.values_like(cartridge.name, v)] == []
            keel("archive", str(folder), "--set-cold-after", "0s", env=env)  # (its erasure marker is from now)
            keel("archive", str(folder), "--once", env=env)                 # the rebuilt generation's history
            assert cold.sizes(cartridge.name)[0] > 0
            assert [v for v in secrets if cold.values_like(cartridge.name, v)] == []
            assert cold.values_like(cartridge.name, "[erased]") > 0
        finally:
            cold.close()
        receipts = [json.loads(r.value) for r in read_topic(env, events_topic(cartridge.name), len(stream) + 1)
                    if b'"keel.erased"' in r.value]
        expected = write_lines(tmp_path / "expected.jsonl", [*masked(stream, "t1", "client:c1", folder), receipts[0]])
        with pytest.raises(ColdTierNotConfigured):            # a process without the cold tier cannot read it
            redis_digests(folder, env, ["t1"])
        served = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=cartridge.name)
        served.cold = ColdStore(cold_dsn)
        try:
            assert digest(served, "t1") == embedded_digests(cartridge, expected)["t1"]
        finally:
            served.close()
    finally:
        assert worker.terminate() == 0
        store = RedisStore.from_url(env["KEEL_REDIS_URL"], namespace=cartridge.name)
        store.cold = ColdStore(cold_dsn)
        store.drop_namespace()
        store.close()


def test_postgresql_lost_is_rebuilt_by_a_replay(tmp_path: Path, cold_dsn: str) -> None:
    """The cold tier's database replaced by an empty one: reads of cold history fail naming the fix, never
    answer short; a rebuild of the tenant (what `keel replay` does) serves everything again, from Redis, and
    the next pass archives the new generation into the new database."""
    cartridge = load_cartridge(FINANCE)
    events = daily_history(tmp_path / "history.jsonl", 90)
    store = _stamped(service_env("KEEL_REDIS_URL"), f"cold{uuid.uuid4().hex[:10]}")
    store.cold = ColdStore(cold_dsn)
    admin = service_env("KEEL_POSTGRES_DSN")
    empty = f"cold_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {empty}")
    try:
        build_embedded(cartridge, events, store=store)
        before = _answers(cartridge, store, changes=False)
        set_policy(store, "1d")
        assert _pass(cartridge, store).moved > 0
        store.cold.close()
        store.cold = ColdStore(admin + ("&" if "?" in admin else "?") + f"options=-csearch_path%3D{empty}")
        assert Tools(cartridge, store, TENANT).context("debt:d0")                       # the present is served
        with pytest.raises(ColdTierUnavailable, match=r"rebuild with `keel replay <cartridge> --all`"):
            Tools(cartridge, store, TENANT).context("debt:d0", at="2024-01-20")
        old = store.current_generation(TENANT)
        gen = store.new_generation(TENANT)
        build_embedded(cartridge, events, store=store.for_generation(TENANT, gen))
        store.switch_generation(TENANT, gen)
        store.drop_generation(TENANT, old)
        assert _answers(cartridge, store, changes=False) == before
        assert _pass(cartridge, store).moved > 0                                         # archived again
        assert _answers(cartridge, store, changes=False) == before
        assert digest(store, TENANT) == embedded_digests(cartridge, events)[TENANT]
    finally:
        store.drop_namespace()
        store.close()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA {empty} CASCADE")


def test_cold_after_is_a_duration_or_never() -> None:
    from keel.cartridge_spec import HistorySpec
    assert HistorySpec().cold_after_micros() is None                                  # default: never
    assert HistorySpec(cold_after="90d").cold_after_micros() == 90 * 86_400 * 1_000_000
    with pytest.raises(ValueError, match="bad duration"):
        HistorySpec(cold_after="90 days")


class _Excess(Mover):
    """A mover that sees Redis over its budget by a fixed number of bytes (the instance's used_memory moves with
    every other test on the shared Redis; the selection is what is checked here)."""
    excess = 0

    def _over_budget(self) -> int:
        return self.excess


def test_over_the_memory_budget_the_oldest_closed_segments_move_first(tmp_path: Path, cold_dsn: str) -> None:
    cartridge = load_cartridge(FINANCE)
    events = daily_history(tmp_path / "history.jsonl", 90)
    store = _stamped(service_env("KEEL_REDIS_URL"), f"cold{uuid.uuid4().hex[:10]}")
    store.cold = ColdStore(cold_dsn)
    try:
        build_embedded(cartridge, events, store=store)
        assert Mover(cartridge, store, ArchiveOptions(budget=1))._over_budget() > 0   # INFO used_memory is read
        gen = store.current_generation(TENANT)
        before = sorted(candidates(store, TENANT, gen), key=lambda c: c.newest)
        mover = _Excess(cartridge, store, ArchiveOptions(once=True, quiet=True, budget=1))
        mover.excess = sum(c.size for c in before[:5]) - 1            # the cartridge says never: only the budget
        report = mover.pass_once()
        assert report.moved == 5
        left = candidates(store, TENANT, gen)
        moved = {(c.entity, c.n) for c in before} - {(c.entity, c.n) for c in left}
        assert len(moved) == 5 and len(left) == len(before) - 5
        newest = {(c.entity, c.n): c.newest for c in before}
        assert max(newest[m] for m in moved) <= min(c.newest for c in left)     # the oldest went
        assert digest(store, TENANT) == embedded_digests(cartridge, events)[TENANT]
    finally:
        store.drop_namespace()
        store.close()
