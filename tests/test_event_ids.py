"""A generation's applied event ids and their marks in Redis (keel/store/redis/event_ids.py, lua.STEP_IDS): marks
packed exactly whatever their text; ids in buckets that split by linear hashing as they grow, each bucket small
enough to stay a listpack, every id found again by the Lua lookup and by the reads of every bucket, and the commit
step's dedupe exact across splits (real Redis for the buckets)."""
from __future__ import annotations

import random
import uuid
from collections.abc import Iterator

import pytest
import redis
from hypothesis import given, settings
from hypothesis import strategies as st
from support.services import service_env

from keel.store.memory import MemoryStore
from keel.store.redis import RedisStore
from keel.store.redis.event_ids import (
    EARLIER,
    id_args,
    id_bucket,
    id_hash,
    note_counts,
    pack_mark,
    unpack_mark,
)
from keel.store.redis.keys import BUCKETS, IDS, TenantKeys
from keel.store.redis.lua import ID_BUCKETS, IDS_PER_BUCKET
from keel.store.writes import event_key

_HEX = st.text("0123456789abcdef", min_size=16, max_size=16)
_NUMBER = st.one_of(st.integers(0, 2 ** 63).map(str), st.text("0123456789", min_size=1, max_size=22),
                    st.sampled_from(["0", "00", "01", "9" * 18, "1" + "0" * 18, "٣", "²", "+1", " 1"]))
_ORIGINS = st.one_of(
    st.just(EARLIER), st.text(),
    st.builds("at line {}".format, _NUMBER),
    st.builds("at {} partition {} offset {}".format, st.text("abcxyz.-_09", min_size=1, max_size=40), _NUMBER,
              _NUMBER),
    st.builds("at {} partition {} offset {}".format, st.text(max_size=20), st.text(max_size=5), st.text(max_size=5)))
_MARKS = st.one_of(st.builds("{} {}".format, _HEX, _ORIGINS), st.text(min_size=1),
                   st.builds("{}{}".format, _HEX, st.text()))


@settings(max_examples=3000, deadline=None)
@given(_MARKS)
def test_a_mark_packs_exactly(mark: str) -> None:
    packed = pack_mark(mark)
    assert packed and unpack_mark(packed) == mark


def test_the_projectors_marks_pack_small() -> None:
    """The marks the projector writes: a 16-hex-digit content hash and where the event was read first."""
    digest = "0123456789abcdef"
    assert pack_mark(None) == pack_mark("") == "" and unpack_mark("") is None
    for origin, size in ((EARLIER, 11), ("at line 15600", 15), ("at keel.finance.events partition 11 offset 123456789",
                                                                  11 + 1 + 1 + 1 + 5 + 1 + len("keel.finance.events"))):
        packed = pack_mark(f"{digest} {origin}")
        assert len(packed) == size and unpack_mark(packed) == f"{digest} {origin}", packed


# What earlier builds packed (their regular expression's), kept byte for byte: stored marks read back the same.
_PACKED = {
    "0123456789abcdef at keel.finance.events partition 11 offset 123456789": "ASNFZ4mrze8KL.HW80V.keel.finance.events",
    "0123456789abcdef at line 15600": "ASNFZ4mrze8LDzw",
    "0123456789abcdef earlier in the log": "ASNFZ4mrze8",
    "0123456789abcdef at t partition 0 offset 0": "ASNFZ4mrze8KA.A.t",
    "fedcba9876543210 at t partition 3 offset 999999999999999999": "_ty6mHZUMhAKD.3gtrOnY___.t",
    "0123456789abcdef at t partition 01 offset 5": "ASNFZ4mrze8 at t partition 01 offset 5",
    "0123456789abcdef at line 0": "ASNFZ4mrze8 at line 0",
    "fedcba9876543210 at t partition 3 offset 1000000000000000000":
        "_ty6mHZUMhA at t partition 3 offset 1000000000000000000",
    "0123456789abcdef at t p partition 1 offset 2": "ASNFZ4mrze8 at t p partition 1 offset 2",
    "0123456789abcdef at t partition \u0663 offset 2": "ASNFZ4mrze8 at t partition \u0663 offset 2",
    "0123456789ABCDEF at line 5": "/0123456789ABCDEF at line 5",
    "x": "/x",
}


@pytest.mark.parametrize("mark", sorted(_PACKED))
def test_marks_pack_as_earlier_builds_packed_them(mark: str) -> None:
    assert pack_mark(mark) == _PACKED[mark] and unpack_mark(_PACKED[mark]) == mark


def _groups(args: list[object]) -> tuple[int, int, list[tuple[object, list[tuple[object, object]]]]]:
    """id_args' arguments read back as STEP_IDS reads them: nI, the bucket count, (bucket, its (id, mark) pairs)."""
    n, nb, x, out = int(args[0]), int(args[1]), 2, []       # type: ignore[call-overload]
    while x < len(args):
        k = int(args[x + 1])                                 # type: ignore[call-overload]
        flat = args[x + 2:x + 2 + 2 * k]
        out.append((args[x], list(zip(flat[::2], flat[1::2]))))
        x += 2 + 2 * k
    return n, nb, out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.text(min_size=1), st.one_of(st.none(), _MARKS), st.one_of(st.none(), st.integers(0, 2 ** 62))),
                max_size=40, unique_by=lambda t: t[0]), st.integers(0, 500), st.integers(1, 9))
def test_a_steps_id_arguments_are_its_ids_and_marks_by_bucket(
        items: list[tuple[str, str | None, int | None]], ne: int, nb: int) -> None:
    """id_args (the writer's one pass over a step's ids) groups each id with pack_mark's answer under its bucket
    for the bucket count the step's splits leave from the counts last noted, and gives the latest recorded_at the
    ids carry; a plain str id carries neither."""
    d = f"t{uuid.uuid4().hex}"
    note_counts(d, ne, nb)
    ids = [event_key(i, m, r) if m is not None or r is not None else i for i, m, r in items]
    latest, args = id_args(d, ids)
    n, after, groups = _groups(args)
    assert n == len(ids) and after == max(nb, -(-(ne + len(ids)) // IDS_PER_BUCKET))
    assert len({b for b, _ in groups}) == len(groups) and all(pairs for _, pairs in groups)   # no empty group
    assert sorted((str(i), m) for b, pairs in groups for i, m in pairs) == \
        sorted((str(i), pack_mark(getattr(i, "mark", None))) for i in ids)
    assert all(b == id_bucket(id_hash(str(i)), after) for b, pairs in groups for i, _ in pairs)
    times = [r for i in ids if (r := getattr(i, "recorded_at", None)) is not None]
    assert latest == (str(max(times)) if times else "")


@pytest.fixture
def store() -> Iterator[RedisStore]:
    probe = RedisStore.from_url(service_env("KEEL_REDIS_URL"), namespace=f"ids{uuid.uuid4().hex[:10]}")
    yield probe
    probe.drop_namespace()
    probe.close()


def test_ids_split_into_small_buckets_and_stay_exact(store: RedisStore) -> None:
    """5,000 ids in steps of 1 to 400, some recommitted: every id in exactly one bucket, each bucket a listpack of
    at most a few times IDS_PER_BUCKET ids, the buckets about ids / IDS_PER_BUCKET; every id (and no other) found
    by has_event, its mark by event_mark, all of them by event_ids, event_marks and tenant_starts, as the memory
    store answers; a step repeating applied ids applies only its new ones."""
    rnd = random.Random(25)
    memory = MemoryStore()
    n, offset = 0, 0
    while n < 5000:
        size = rnd.choice([1, 1, 2, 7, 60, 400])
        events = []
        for _ in range(size):
            n += 1
            mark = rnd.choice([None, f"{rnd.getrandbits(64):016x} at line {n}", f"{rnd.getrandbits(64):016x} {EARLIER}",
                               f"{rnd.getrandbits(64):016x} at keel.t.events partition 2 offset {n * 3}", "odd | mark"])
            events.append(([], event_key(f"ev-{n}-{rnd.getrandbits(20)}", mark, 1_000 + n)))
        if rnd.random() < 0.2:              # a step repeating some applied ids (their marks as first seen stay)
            events += [([], event_key(i, "ffffffffffffffff at line 1", 5)) for i in memory.event_ids("t")[:5]]
        offset += 1
        for s in (store, memory):
            s.commit_batch("t", events, ("keel.t.events", 2, offset))
    client = store.client
    d = TenantKeys(store.namespace, "t").data(1)
    count, buckets = (int(x) for x in client.hmget(d + "m", IDS, BUCKETS))
    assert count == len(memory.event_ids("t")) == n
    assert (buckets - 1) * IDS_PER_BUCKET < count <= buckets * IDS_PER_BUCKET
    held: list[str] = []
    for b in range(buckets):
        assert client.object("encoding", f"{d}e:{b}") == "listpack"
        held += client.hkeys(f"{d}e:{b}")
    assert sorted(held) == memory.event_ids("t")          # each id in one bucket
    assert store.event_ids("t") == memory.event_ids("t")
    assert store.event_marks("t") == memory.event_marks("t")
    for event_id in rnd.sample(held, 300) + ["ev-0", "nope"]:
        assert store.has_event("t", event_id) == memory.has_event("t", event_id)
        assert store.event_mark("t", event_id) == memory.event_mark("t", event_id)
    tps = [("keel.t.events", 2)]
    assert store.tenant_starts([("t", tps)]) == memory.tenant_starts([("t", tps)])
    scanned = set(client.scan_iter(match=d.replace("{", "\\{").replace("}", "\\}") + "*", count=1000))
    assert scanned <= set(store.key_names("t")) and {f"{d}e:{b}" for b in range(buckets)} <= scanned


def test_a_large_step_splits_the_buckets_before_it_adds_its_ids(store: RedisStore) -> None:
    """A replay's steps carry thousands of ids: the buckets are split first, so none ever holds a whole step (a
    hash past hash-max-listpack-entries would stay a hashtable after its split), and a step refused for an id
    applied before still leaves the buckets exact."""
    store.commit_batch("t", [([], event_key(f"a{i}", f"{i:016x} at line {i}", 1)) for i in range(3000)], None)
    again = [([], event_key(f"b{i}", None, 2)) for i in range(3000)] + [([], event_key("a7", None, 2))]
    store.commit_batch("t", again, None)               # a7 applied before: the step goes on without it
    d = TenantKeys(store.namespace, "t").data(1)
    client = store.client
    count, buckets = (int(x) for x in client.hmget(d + "m", IDS, BUCKETS))
    assert count == 6000 and (buckets - 1) * IDS_PER_BUCKET < count <= buckets * IDS_PER_BUCKET
    assert {client.object("encoding", f"{d}e:{b}") for b in range(buckets)} == {"listpack"}
    assert store.event_ids("t") == sorted([f"a{i}" for i in range(3000)] + [f"b{i}" for i in range(3000)])
    assert store.event_mark("t", "a7") == f"{7:016x} at line 7" and store.event_mark("t", "b7") is None
    assert store.has_event("t", "b2999") and not store.has_event("t", "c1")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=80), min_size=1, max_size=50), st.integers(1, 5000))
def test_the_writer_buckets_ids_as_the_lua_buckets_do(ids: list[str], nb: int) -> None:
    """The writer groups a step's ids by bucket (event_ids.id_hash and id_bucket) so the APPLY script spends no
    SHA-1 on them; splits, single look-ups and a stale guess hash in Lua (lua.ID_BUCKETS): both must give the same
    hash and bucket for any text and bucket count."""
    client = redis.Redis.from_url(service_env("KEEL_REDIS_URL"), decode_responses=True)
    try:
        got = client.eval(ID_BUCKETS + "local nb = tonumber(ARGV[1]) local out = {} for i = 2, #ARGV do "
                                       "local h = id_hash(ARGV[i]) "
                                       "out[#out + 1] = {tostring(h), id_bucket(h, nb, id_top(nb))} end "
                                       "return out", 0, nb, *ids)
    finally:
        client.close()
    assert [(int(h), b) for h, b in got] == [(id_hash(i), id_bucket(id_hash(i), nb)) for i in ids]


def test_a_stale_guess_of_the_buckets_still_adds_each_id_to_its_bucket(store: RedisStore) -> None:
    """The writer's guess of the bucket count (the counts the last APPLY answered) may be stale: another writer
    added ids meanwhile, or this one just started. The script then groups the ids itself: every id is found by the
    Lua look-up in its bucket, the dedupe stays exact, and the answer sets the guess right again."""
    d = TenantKeys(store.namespace, "t").data(1)
    memory = MemoryStore()
    for step, (ne, nb) in enumerate([(0, 1), (0, 1), (0, 1), (1000, 7), (0, 1), (70, 3), (None, None)]):
        events = [([], event_key(f"s{step}-{i}", f"{i:016x} at line {i}", 1)) for i in range(45)]
        events += [([], event_key(f"s0-{step}", None, 1))]          # applied at step 0 (from step 1 on)
        if ne is not None:
            note_counts(d, ne, nb)
        for s in (store, memory):
            s.commit_batch("t", events, None)
    count, buckets = (int(x) for x in store.client.hmget(d + "m", IDS, BUCKETS))
    assert count == len(memory.event_ids("t")) and (buckets - 1) * IDS_PER_BUCKET < count <= buckets * IDS_PER_BUCKET
    for b in range(buckets):
        assert all(id_bucket(id_hash(i), buckets) == b for i in store.client.hkeys(f"{d}e:{b}"))
    assert store.event_marks("t") == memory.event_marks("t") and store.event_ids("t") == memory.event_ids("t")
    assert all(store.has_event("t", i) for i in memory.event_ids("t"))
    assert id_args(d, ["x"])[1][:2] == [1, max(buckets, -(-(count + 1) // IDS_PER_BUCKET))]
