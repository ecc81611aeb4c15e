"""The change log's old chunks in the cold tier (keel/store/redis/cold.py's move_changes, keel/cold_pg.py's
keel_cold_changes), against real Redis and PostgreSQL: `keel archive` trims the oldest chunks from the Redis list
with a marker, positions stay, and every page of the log (from a position, from `since`, from the start) is the
same with tiering on and off, while writes arrive and further passes move more; a cold tier that is down or
missing refuses a page that needs it (never a short page), and a mover killed between copy and trim loses and
doubles nothing."""
from __future__ import annotations

import datetime as dt
import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from support.services import service_env
from support.workers import ROOT
from test_cold_tier import _stamped, cold_dsn, daily_history  # noqa: F401 - the fixture: a private schema

from keel.cartridge import load_cartridge
from keel.cold_pg import CHANGES_TABLE, ColdStore
from keel.embedded import build_embedded
from keel.errors import ColdTierNotConfigured, ColdTierUnavailable
from keel.store.redis import RedisStore
from keel.store.redis.cold import changes_moved, cold_count, move_changes
from keel.store.redis.keys import CHANGES
from workers.archive import ArchiveOptions, Mover, set_policy

pytestmark = [pytest.mark.services, pytest.mark.timeout(600)]
FINANCE = ROOT / "cartridges" / "finance"
TENANT = "acme"
KEEP = 10


def _chunk_rows(dsn: str, namespace: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass(%s)", (CHANGES_TABLE,)).fetchone()
        if exists is None or exists[0] is None:
            return 0
        row = conn.execute(f"SELECT count(*) FROM {CHANGES_TABLE} WHERE namespace = %s", (namespace,)).fetchone()
    return int(row[0]) if row else 0


def _more(path: Path, day: int) -> Path:
    """One more day of snapshots (days after daily_history's), each event its own commit step."""
    when = (dt.date(2024, 1, 1) + dt.timedelta(days=day)).isoformat()
    lines = [{"id": f"more-{k}-{day}", "tenant": TENANT, "type": "debt.snapshot", "subject": f"debt:d{k}",
              "occurred_at": when, "payload": {"creditor": "Banco", "product": f"P{k}", "balance_cop": 4_000_000 - day,
                                               "rate_ea_pct": 21, "installment_cop": 50_000, "month": when[:7]}}
             for k in range(3)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _llen(store: RedisStore) -> int:
    return int(store.client.llen(store.data_prefix(TENANT, store.current_generation(TENANT)) + CHANGES))


class _Pair:
    """The same events in two layout-2 namespaces: `off` (no cold tier) and `on` (its old chunks in PostgreSQL)."""

    def __init__(self, tmp: Path, dsn: str, days: int) -> None:
        self.tmp, self.day = tmp, days
        self.cartridge = load_cartridge(FINANCE)
        url = service_env("KEEL_REDIS_URL")
        self.off = _stamped(url, f"choff{uuid.uuid4().hex[:10]}")
        self.on = _stamped(url, f"chon{uuid.uuid4().hex[:10]}")
        self.on.cold = ColdStore(dsn)
        events = daily_history(tmp / "history.jsonl", days)
        for store in (self.off, self.on):
            assert not build_embedded(self.cartridge, events, store=store)[1].rejected
        set_policy(self.on, "30d")

    def archive(self) -> Any:
        return Mover(self.cartridge, self.on, ArchiveOptions(once=True, quiet=True, batch=7,
                                                             keep_chunks=KEEP)).pass_once()

    def write(self) -> None:
        """One more day, committed to both."""
        events = _more(self.tmp / f"more{self.day}.jsonl", self.day)
        self.day += 1
        for store in (self.off, self.on):
            assert not build_embedded(self.cartridge, events, store=store)[1].rejected

    def page(self, **kw: Any) -> Any:
        a = self.off.change_page(TENANT, **kw)
        b = self.on.change_page(TENANT, **kw)
        assert a == b, kw
        return b

    def close(self) -> None:
        for store in (self.off, self.on):
            store.drop_namespace()
            store.close()


def test_change_pages_are_the_same_with_old_chunks_in_postgresql(tmp_path: Path, cold_dsn: str) -> None:  # noqa: F811
    pair = _Pair(tmp_path, cold_dsn, 50)
    try:
        chunks = _llen(pair.on)
        assert chunks > 4 * KEEP                                   # one chunk per commit step: many
        whole = pair.on.change_page(TENANT, count=100_000)
        report = pair.archive()
        assert report.chunks_moved == chunks - KEEP == _chunk_rows(cold_dsn, pair.on.namespace)
        assert _llen(pair.on) == KEEP                               # Redis keeps the newest chunks only
        gen = pair.on.current_generation(TENANT)
        moved_chunks, moved_writes = changes_moved(pair.on, TENANT, gen)
        assert moved_chunks == chunks - KEEP
        assert 0 < moved_writes < whole.length
        assert cold_count(pair.on, TENANT, gen) == report.moved     # the marker is no closed segment
        assert pair.on.change_page(TENANT, count=100_000) == whole  # the whole log, from both tiers
        assert pair.archive().chunks_moved == 0                     # a second pass has nothing to do

        for size in (1, 3, 100):                                    # page the whole log, writes arriving
            pos, pages = 0, 0
            while True:
                page = pair.page(start=pos, generation=gen, count=size)
                assert page.start == pos
                assert [e.position for e in page.entries] == list(range(pos, pos + len(page.entries)))
                pos += len(page.entries)
                pages += 1
                if pos >= page.length:
                    break
                assert len(page.entries) == size                    # never a short page
                if pages % 97 == 0:
                    pair.write()
                if pages % 293 == 0:
                    assert pair.archive().chunks_moved > 0           # more moves while a reader pages
            assert pages > 3

        whole = pair.page(count=100_000)                            # `since`: from before, inside, after
        times = sorted({e.assertion.recorded_at for e in whole.entries})
        assert len(times) > 20
        for since in [times[0] - 1, *times[::7], times[-1]]:
            for size in (1, 3, 100):
                page = pair.page(since=since, count=size)
                assert all(e.assertion.recorded_at > since for e in page.entries)
                assert page.entries or since == times[-1]
        assert pair.page(count=5).start == 0                        # from the log's start: position 0, cold
    finally:
        pair.close()
        assert _chunk_rows(cold_dsn, pair.on.namespace) == 0       # the namespace's drop took its chunks


def test_a_page_needing_a_cold_tier_that_is_down_or_missing_is_refused(tmp_path: Path,
                                                                      cold_dsn: str) -> None:  # noqa: F811
    pair = _Pair(tmp_path, cold_dsn, 40)
    try:
        pair.archive()
        gen = pair.on.current_generation(TENANT)
        length = pair.on.change_page(TENANT, count=1).length
        head = changes_moved(pair.on, TENANT, gen)[1]
        assert head > 0
        down = type(pair.on)(pair.on.client, namespace=pair.on.namespace)
        down.cold = ColdStore("postgresql://keel@127.0.0.1:1/none", connect_timeout=2)    # nothing listens
        bare = type(pair.on)(pair.on.client, namespace=pair.on.namespace)
        for store, error in ((down, ColdTierUnavailable), (bare, ColdTierNotConfigured)):
            recent = store.change_page(TENANT, start=head, generation=gen, count=length)  # Redis's part: served
            assert recent == pair.off.change_page(TENANT, start=head, generation=gen, count=length)
            for kw in ({"start": 0, "generation": gen}, {"start": head - 1, "generation": gen}, {},
                       {"since": 0}):
                with pytest.raises(error):
                    store.change_page(TENANT, count=3, **kw)

        with psycopg.connect(cold_dsn, autocommit=True) as conn:   # a chunk lost from PostgreSQL: refused
            conn.execute(f"DELETE FROM {CHANGES_TABLE} WHERE namespace = %s AND position = "
                         f"(SELECT max(position) FROM {CHANGES_TABLE} WHERE namespace = %s)",
                         (pair.on.namespace, pair.on.namespace))
        with pytest.raises(ColdTierUnavailable, match="lacks"):
            pair.on.change_page(TENANT, start=head - 1, generation=gen, count=3)
    finally:
        pair.close()


def test_a_mover_stopped_between_copy_and_trim_loses_and_doubles_nothing(tmp_path: Path,
                                                                         cold_dsn: str) -> None:  # noqa: F811
    pair = _Pair(tmp_path, cold_dsn, 40)
    try:
        store, cold = pair.on, pair.on.cold
        assert cold is not None
        gen = store.current_generation(TENANT)
        whole = store.change_page(TENANT, count=100_000)
        key = store.data_prefix(TENANT, gen) + CHANGES
        first = store.client.lrange(key, 0, 4)                     # copied, as a mover killed before its trim
        cold.put_changes(store.namespace, TENANT, gen,
                         [(int(c[1:c.index("|")]), int(c.split("|")[1]), int(c.split("|")[2]), c) for c in first])
        assert _llen(store) > KEEP
        assert store.change_page(TENANT, count=100_000) == whole    # nothing trimmed yet: Redis answers
        chunks = _llen(store)
        moved, _ = move_changes(store, TENANT, gen, keep=KEEP, batch=3)
        assert moved == chunks - KEEP == _chunk_rows(cold_dsn, store.namespace)      # no row twice
        assert store.change_page(TENANT, count=100_000) == whole
        assert move_changes(store, TENANT, gen, keep=KEEP) == (0, 0)
    finally:
        pair.close()


def test_keel_archive_keep_chunks_sets_how_much_of_the_log_stays_in_redis(tmp_path: Path,
                                                                          cold_dsn: str) -> None:  # noqa: F811
    """`keel archive --once --keep-chunks N` leaves each tenant's newest N chunks in Redis and moves the rest;
    the pages are what they were."""
    from support.workers import keel, unique_cartridge
    folder = unique_cartridge(tmp_path)
    cartridge = load_cartridge(folder)
    store = _stamped(service_env("KEEL_REDIS_URL"), cartridge.name)
    try:
        assert not build_embedded(cartridge, daily_history(tmp_path / "history.jsonl", 40), store=store)[1].rejected
        before, chunks = store.change_page(TENANT, count=100_000), _llen(store)
        assert chunks > 20
        set_policy(store, "30d")
        env = {"KEEL_REDIS_URL": service_env("KEEL_REDIS_URL"), "KEEL_COLD_DSN": cold_dsn}
        keel("archive", str(folder), "--once", "--keep-chunks", "5", "--quiet", env=env)
        assert _llen(store) == 5 and _chunk_rows(cold_dsn, cartridge.name) == chunks - 5
        store.cold = ColdStore(cold_dsn)
        assert store.change_page(TENANT, count=100_000) == before
        refused = keel("archive", str(folder), "--once", "--keep-chunks", "0", env=env, check=False)
        assert refused.returncode == 2 and "--keep-chunks" in refused.stderr, refused.stderr
    finally:
        store.drop_namespace()
        store.close()
