"""Personal data on the Kafka -> workers -> Redis path (issue 24, second slice; docs/privacy.md): `keel publish`
seals with the key store, workers and `keel replay` reveal, `keel erase --redis --kafka` shreds and rebuilds."""
from __future__ import annotations

import base64
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.workers import (
    WorkerProcess,
    embedded_digests,
    keel,
    read_topic,
    redis_digests,
    services,
    services_env,
    wait_applied,
)
from test_privacy import (
    MASTER,
    SECRET_NAME,
    STREAM,
    envelope,
    masked,
    plaintext_forms,
    write_cartridge,
    write_lines,
)

from keel.cartridge import load_cartridge
from keel.cli import main

ERASED_VALUES = [SECRET_NAME, SECRET_NAME + " (2)", "+57 300 555 0101", "+57 300 555 0103", "alérgica al látex"]


def unique_clinic(tmp_path: Path) -> Path:
    folder = write_cartridge(tmp_path / "clinic")
    text = (folder / "cartridge.yaml").read_text(encoding="utf-8")
    (folder / "cartridge.yaml").write_text(text.replace("name: clinic", f"name: p{uuid.uuid4().hex[:10]}", 1),
                                           encoding="utf-8")
    return folder


def test_a_worker_of_a_personal_cartridge_refuses_to_start_without_a_key_store(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for var in ("KEEL_KEYS_DSN", "KEEL_KEYS_FILE"):
        monkeypatch.delenv(var, raising=False)
    folder = write_cartridge(tmp_path / "c")
    assert main(["worker", str(folder), "--redis", "redis://127.0.0.1:1/0"]) == 2
    err = capsys.readouterr().err
    assert "declares personal fields" in err and "--keys-dsn" in err
    assert main(["replay", str(folder), "--tenant", "t1", "--redis", "redis://127.0.0.1:1/0"]) == 2
    assert "declares personal fields" in capsys.readouterr().err


@pytest.fixture
def keyed_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """Kafka, Redis, the master key and a PostgreSQL key store in a fresh schema (dropped afterwards)."""
    import psycopg
    from support.services import service_env
    dsn = service_env("KEEL_POSTGRES_DSN")
    env = services_env()
    schema = f"k_{uuid.uuid4().hex[:12]}"
    sep = "&" if "?" in dsn else "?"
    env.update({"KEEL_MASTER_KEY": base64.b64encode(MASTER).decode(), "KEEL_MASTER_KEY_FILE": "",
                "KEEL_KEYS_DSN": f"{dsn}{sep}options=-csearch_path%3D{schema}", "KEEL_KEYS_FILE": ""})
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    try:
        yield env
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP SCHEMA IF EXISTS {schema} CASCADE")


def topic_bytes(env: dict[str, str], topic: str, expected: int) -> bytes:
    records = read_topic(env, topic, expected)
    assert len(records) >= expected
    return b"\n".join((r.key or b"") + b"\0" + (r.value or b"") for r in records)


@services
def test_publish_seals_and_the_worker_builds_the_clear_graph(tmp_path: Path, keyed_env: dict[str, str]) -> None:
    from keel.wire import events_topic
    env = keyed_env
    folder = unique_clinic(tmp_path)
    clear = write_lines(tmp_path / "clear.jsonl", STREAM)
    keel("publish", str(folder), str(clear), "--partitions", "2", env=env)
    topic = events_topic(load_cartridge(folder).name)
    stored = topic_bytes(env, topic, len(STREAM))
    for value in ERASED_VALUES + ["Ana Ruiz", "Other Tenant"]:
        for form in plaintext_forms(value):
            assert form not in stored, value
    assert stored.count(b'"keel.enc":"v1"') == 10      # name and phone of 4 registrations, remark of 2 visits
    worker = WorkerProcess([folder], env, tmp_path / "worker.log")
    try:
        wait_applied(folder, env, len(STREAM), worker)
    finally:
        assert worker.terminate() == 0
    expected = embedded_digests(load_cartridge(folder), clear)
    assert redis_digests(folder, env, ["t1", "t2"]) == expected


def redis_values(env: dict[str, str], namespace: str) -> bytes:
    """Every key and value of a cartridge's Redis namespace (SCAN, read by type), as one byte string."""
    import redis
    client = redis.Redis.from_url(env["KEEL_REDIS_URL"])
    out: list[bytes] = []
    try:
        for key in client.scan_iter(match=f"*{namespace}*", count=1000):
            kind = client.type(key)
            out.append(key)
            if kind == b"string":
                out.append(client.get(key) or b"")
            elif kind == b"hash":
                for k, v in client.hgetall(key).items():
                    out += [k, v]
            elif kind == b"list":
                out += client.lrange(key, 0, -1)
            elif kind == b"set":
                out += list(client.smembers(key))
            elif kind == b"zset":
                out += [m for m, _ in client.zrange(key, 0, -1, withscores=True)]
            elif kind == b"stream":
                for _, fields in client.xrange(key):
                    for k, v in fields.items():
                        out += [k, v]
            else:
                raise AssertionError(f"unread Redis type {kind!r} of {key!r}")
    finally:
        client.close()
    assert out, f"no Redis key of {namespace}"
    return b"\n".join(out)


@services
def test_erase_shreds_a_subject_in_redis_and_kafka(tmp_path: Path, keyed_env: dict[str, str]) -> None:
    import json

    from keel.wire import events_topic
    env = keyed_env
    folder = unique_clinic(tmp_path)
    name = load_cartridge(folder).name
    clear = write_lines(tmp_path / "clear.jsonl", STREAM)
    keel("publish", str(folder), str(clear), "--partitions", "2", env=env)
    worker = WorkerProcess([folder], env, tmp_path / "worker.log")
    try:
        wait_applied(folder, env, len(STREAM), worker)
        before = redis_digests(folder, env, ["t1", "t2"])
        plain_before = redis_values(env, name)
        assert SECRET_NAME.encode() in plain_before       # the live graph holds the revealed values
        erase = ["erase", str(folder), "--redis", env["KEEL_REDIS_URL"], "--kafka", env["KEEL_KAFKA_BOOTSTRAP"],
                 "--tenant", "t1", "--subject", "client:c1", "--reason", "request 2026-117"]
        first = keel(*erase, env=env).stdout
        assert "client:c1 of tenant t1: erased (1 key deleted)" in first and "produced to the topic" in first
        topic = events_topic(name)
        records = read_topic(env, topic, len(STREAM) + 1)
        receipts = [json.loads(r.value) for r in records if b'"keel.erased"' in r.value]
        assert len(receipts) == 1 and receipts[0]["payload"] == {"keys": 1, "reason": "request 2026-117"}
        wait_applied(folder, env, len(STREAM) + 1, worker)
        second = keel(*erase, env=env).stdout                                       # idempotent
        assert "already erased at" in second and "already in the graph" in second
        assert len([r for r in read_topic(env, topic, len(STREAM) + 1) if b'"keel.erased"' in r.value]) == 1
        after = redis_digests(folder, env, ["t1", "t2"])
        keel("replay", str(folder), "--all", "--quiet", "--redis", env["KEEL_REDIS_URL"], env=env)
        assert redis_digests(folder, env, ["t1", "t2"]) == after        # a rebuild of every tenant: the same
    finally:
        assert worker.terminate() == 0
    expected = write_lines(tmp_path / "expected.jsonl", [*masked(STREAM, "t1", "client:c1", folder), receipts[0]])
    assert after == embedded_digests(load_cartridge(folder), expected)
    assert after["t2"] == before["t2"] and after["t1"] != before["t1"]
    stored = redis_values(env, name) + b"\n" + topic_bytes(env, topic, len(STREAM) + 1)
    hits = [(v, f) for v in ERASED_VALUES for f in plaintext_forms(v) if f in stored]
    assert hits == []
    assert b"Ana Ruiz" in redis_values(env, name)               # another subject's values are still there


def test_the_worker_judge_reveals_masks_and_refuses_without_crashing(tmp_path: Path) -> None:
    import json

    from keel.keystore import FileKeyStore
    from keel.privacy import Privacy
    from keel.projector import Projector
    from workers.judge import judge
    from workers.mirror import RecordingStore
    from workers.records import Record
    folder = write_cartridge(tmp_path / "c")
    cartridge = load_cartridge(folder)
    privacy = Privacy(cartridge, FileKeyStore(tmp_path / "k.json", MASTER))
    sealed = privacy.seal(STREAM[0])
    value = json.dumps(sealed).encode()

    def verdict(raw: bytes):
        recorder = RecordingStore()
        return judge(Projector(cartridge, recorder), recorder, Record("keel.c.events", 0, 0, None, b"t1", raw),
                     reveal=privacy.reveal_line)
    applied = verdict(value)
    assert applied.outcome == "applied" and applied.event.payload["name"] == SECRET_NAME
    ct = bytearray(base64.b64decode(sealed["payload"]["name"]["ct"]))
    ct[0] ^= 1
    tampered = {**sealed, "payload": {**sealed["payload"], "name": {**sealed["payload"]["name"],
                                                                     "ct": base64.b64encode(bytes(ct)).decode()}}}
    refused = verdict(json.dumps(tampered).encode())
    assert refused.outcome == "refused" and "payload.name" in refused.reason and "does not verify" in refused.reason
    unknown = {**sealed, "payload": {**sealed["payload"], "name": {**sealed["payload"]["name"], "kid": "0" * 32}}}
    refused = verdict(json.dumps(unknown).encode())
    assert refused.outcome == "refused" and "is not in key file" in refused.reason
    for r in (refused.reason, verdict(json.dumps(tampered).encode()).reason):
        assert all(form.decode(errors="replace") not in r for form in plaintext_forms(SECRET_NAME))
    privacy.keys.erase("t1", "client:c1")
    masked_verdict = verdict(value)
    assert masked_verdict.outcome == "applied" and masked_verdict.event.payload["name"] == "[erased]"


@services
def test_a_worker_dead_letters_clear_personal_fields_masked(tmp_path: Path, keyed_env: dict[str, str]) -> None:
    """Records whose personal fields arrive in clear (a producer that did not seal) go to the dead-letter topic
    with a reason naming the fields and with their values masked: neither the dead-letter topic nor the worker's
    log holds them."""
    import json

    from support.workers import produce_raw

    from keel.wire import dlq_topic, events_topic
    env = keyed_env
    folder = unique_clinic(tmp_path)
    name = load_cartridge(folder).name
    clear = [STREAM[0], STREAM[2], STREAM[5]]
    produce_raw(env, events_topic(name), [(e["tenant"].encode(), json.dumps(e, ensure_ascii=False).encode())
                                          for e in clear], partitions=2)
    log = tmp_path / "worker.log"
    worker = WorkerProcess([folder], env, log)
    try:
        wait_applied(folder, env, len(clear), worker)
        letters = read_topic(env, dlq_topic(name), len(clear))
    finally:
        assert worker.terminate() == 0
    assert len(letters) == len(clear)
    by_id = {json.loads(r.value)["id"]: r for r in letters}
    assert json.loads(by_id["e1"].value)["payload"] == {"name": "[erased]", "phone": "[erased]", "channel": "web"}
    assert json.loads(by_id["e3"].value)["payload"] == {"client": "client:c1", "remark": "(erased)", "price": 40}
    reason = dict(by_id["e3"].headers)["keel.reason"].decode()
    assert reason.startswith("payload.remark: personal data in clear (not shown)")
    stored = b"\n".join(r.value + b"".join(v for _, v in r.headers) for r in letters) + log.read_bytes()
    hits = [(v, f) for v in ERASED_VALUES + ["Other Tenant", "+1 555 0100"] for f in plaintext_forms(v) if f in stored]
    assert hits == []


def key_store_text(env: dict[str, str]) -> bytes:
    """Every row of the key store's tables (the test's schema), as text."""
    import psycopg
    out: list[str] = []
    with psycopg.connect(env["KEEL_KEYS_DSN"], autocommit=True) as conn:
        for table in ("keel_keys", "keel_keys_erased", "keel_keys_erasures", "keel_keys_offboarded"):
            out += [repr(row) for row in conn.execute(f"SELECT * FROM {table}").fetchall()]
    assert out
    return "\n".join(out).encode()


@services
def test_erase_and_offboard_leave_no_personal_value_anywhere(tmp_path: Path, keyed_env: dict[str, str]) -> None:
    """Issue 24's "Done when": a stream of several subjects in three tenants (sealed by keel publish, plus records
    that arrive in clear), a note on the subject; erase one subject of t1 and offboard t2 while a worker runs;
    then no erased or offboarded value, as written, JSON-escaped or in base64, is in any Redis value of the
    cartridge's namespace, any record of the events topic (the clear arrivals' own values aside: a producer
    wrote them there) or of the dead-letter topic, the worker's log, the commands' output, search results or
    the key store; the same after `keel replay --all`; t3's digest is unchanged, t2 has no Redis key left, and
    `keel status` lists t2 as offboarded. An MCP server (`keel serve` over Redis, its call log and audit log kept)
    answers with the revealed values before the erasure and the mask after; its logs hold neither."""
    import json

    import anyio
    from support.mcp_sessions import ok, stdio_session
    from support.workers import produce_raw

    from keel.wire import dlq_topic, events_topic
    env = keyed_env
    folder = unique_clinic(tmp_path)
    name = load_cartridge(folder).name
    t3 = [envelope(20, "t3", "client.registered", "client:c7", {"name": "Untouched Person", "phone": "+1 555 0177"}),
          envelope(21, "t3", "visit.completed", "visit:v7", {"client": "client:c7", "remark": "no changes",
                                                             "price": 10})]
    stream = [*STREAM, *t3]
    keel("publish", str(folder), str(write_lines(tmp_path / "clear.jsonl", stream)), "--partitions", "2", env=env)
    late_clear = "Llegó Sin Sellar"        # a producer that does not seal: dead-lettered, masked
    produce_raw(env, events_topic(name), [(b"t1", json.dumps(envelope(
        9, "t1", "client.registered", "client:c1", {"name": late_clear, "phone": "+57 300 555 0199"})).encode())],
        partitions=2)
    log = tmp_path / "worker.log"
    worker = WorkerProcess([folder], env, log)
    outputs: list[str] = []
    redis = ["--redis", env["KEEL_REDIS_URL"]]
    note = "nota privada sobre la clienta"
    serve_log, audit_log = tmp_path / "serve.log", tmp_path / "audit.jsonl"

    def mcp_name() -> str:
        """c1's name over MCP, after a search for it by name (the query reaches the server's logs' path)."""
        async def go() -> str:
            with serve_log.open("a") as err:
                async with stdio_session(str(folder), *redis, "--tenant", "t1", "--agent", "care",
                                         "--log-format", "json", "--audit", str(audit_log), stderr=err) as s:
                    await ok(s, "search", {"query": SECRET_NAME})
                    return str((await ok(s, "context", {"entity": "client:c1"}))["labels"]["name"])
        return anyio.run(go)
    try:
        wait_applied(folder, env, len(stream) + 1, worker)
        outputs.append(keel("annotate", str(folder), *redis, "client:c1", "call", note, "--tenant", "t1", "--scope",
                            "tenant", "--evidence", "e1", "--json", env=env).stdout)
        wait_applied(folder, env, len(stream) + 2, worker)
        before = redis_digests(folder, env, ["t1", "t2", "t3"])
        found = keel("search", str(folder), *redis, "Zoë", "--tenant", "t1", "--json", env=env).stdout
        assert "client:c1" in found                                  # the tools answer with the revealed values
        c2_before = keel("context", str(folder), *redis, "client:c2", "--tenant", "t1", "--json", env=env).stdout
        with pytest.MonkeyPatch.context() as mp:             # the server is a subprocess of this environment
            for k, v in env.items():
                mp.setenv(k, v)
            assert mcp_name() == SECRET_NAME + " (2)"         # the revealed value, before the erasure
        outputs.append(keel("erase", str(folder), *redis, "--kafka", env["KEEL_KAFKA_BOOTSTRAP"], "--tenant", "t1",
                            "--subject", "client:c1", env=env).stdout)
        first = keel("offboard", str(folder), *redis, "--kafka", env["KEEL_KAFKA_BOOTSTRAP"], "--tenant", "t2",
                     "--reason", "contract ended", env=env).stdout
        assert "tenant t2: offboarded (1 key shredded); receipt offboarded-" in first and "produced" in first
        second = keel("offboard", str(folder), *redis, "--kafka", env["KEEL_KAFKA_BOOTSTRAP"], "--tenant", "t2",
                      env=env).stdout
        assert "tenant t2: already offboarded at" in second and "already in the log" in second
        outputs += [first, second]
        # t2's later events are refused to the dead-letter topic (one sealed field, one in clear)
        produce_raw(env, events_topic(name), [(b"t2", json.dumps(envelope(
            30, "t2", "client.registered", "client:c1", {"name": "Late Tenant Two", "phone": "+1 555 0130"})).encode())],
            partitions=2)
        wait_applied(folder, env, len(stream) + 5, worker)    # + clear one, note, 2 receipts, late t2
        after = redis_digests(folder, env, ["t1", "t3"])
        c2_after = keel("context", str(folder), *redis, "client:c2", "--tenant", "t1", "--json", env=env).stdout
        searches = [keel("search", str(folder), *redis, q, "--tenant", "t1", "--json", env=env).stdout
                    for q in ("Zoë", "Quintana", "látex", "nota")]
        history = keel("history", str(folder), *redis, "client:c1", "--tenant", "t1", "--json", env=env).stdout
        outputs.append(history)
        erased_at = [v for v in json.loads(history)["versions"] if v["predicate"] == "keel.erased"]
        assert len(erased_at) == 1 and erased_at[0]["evidence"].startswith("erased-")    # history says when
        assert [v["value"] for v in json.loads(history)["versions"] if v["predicate"] == "call"] == ["[erased]"]
        status = json.loads(keel("status", str(folder), *redis, "--json", env=env, check=False).stdout)
        with pytest.MonkeyPatch.context() as mp:
            for k, v in env.items():
                mp.setenv(k, v)
            assert mcp_name() == "[erased]"                   # the mask, after it
    finally:
        assert worker.terminate() == 0
    assert after["t3"] == before["t3"] and after["t1"] != before["t1"]
    assert json.loads(c2_after)["labels"] == json.loads(c2_before)["labels"]
    assert all(json.loads(s)["results"] == [] or all(r["entity"] != "client:c1" for r in json.loads(s)["results"])
               for s in searches[:3])
    assert set(status["offboarded"]) == {"t2"} and status["offboarded"]["t2"]["keys"] == 1
    letters = read_topic(env, dlq_topic(name), 2)
    reasons = sorted(dict(r.headers)["keel.reason"].decode()[:40] for r in letters)
    assert len(letters) == 2 and reasons[0].startswith("payload.name, payload.phone: personal") and \
        reasons[1].startswith("tenant 't2' was offboarded at")

    erased = ERASED_VALUES + ["Other Tenant", "+1 555 0100"]          # t1's c1, and every value of t2
    arrived_clear = [late_clear, "+57 300 555 0199", "Late Tenant Two", "+1 555 0130"]

    def scan(label: str) -> None:
        topic = topic_bytes(env, events_topic(name), len(stream) + 5)
        dead = b"\n".join((r.value or b"") + b"".join(v for _, v in r.headers)
                          for r in read_topic(env, dlq_topic(name), 2))
        places = {"redis": redis_values(env, name), "events topic": topic, "dead letters": dead,
                  "worker log": log.read_bytes(), "outputs": "\n".join(outputs).encode(),
                  "MCP server log": serve_log.read_bytes(), "audit log": audit_log.read_bytes(),
                  "search": "\n".join(searches).encode(), "key store": key_store_text(env)}
        hits = [(label, where, v) for where, text in places.items()
                for v in erased + (arrived_clear if where != "events topic" else []) + [note] * (where == "redis")
                for f in plaintext_forms(v) if f in text]
        assert hits == []
        assert b"Untouched Person" in places["redis"] and b"Ana Ruiz" in places["redis"]     # others kept
        assert f"{{{name}/t2}}".encode() not in places["redis"]                               # no key of t2

    assert serve_log.read_bytes().count(b'"message":"tool_call"') == 4 and len(audit_log.read_bytes().splitlines()) == 4
    scan("after erase and offboard")
    replayed = keel("replay", str(folder), "--all", "--quiet", *redis, env=env)
    outputs.append(replayed.stdout + replayed.stderr)
    assert redis_digests(folder, env, ["t1", "t3"]) == after
    scan("after keel replay --all")
    refused = keel("replay", str(folder), "--tenant", "t2", *redis, env=env, check=False)
    assert refused.returncode == 2 and "tenant 't2' was offboarded" in refused.stderr


@services
def test_an_offboarded_tenant_stays_gone_after_redis_is_lost_and_rebuilt(tmp_path: Path,
                                                                         keyed_env: dict[str, str]) -> None:
    """The log's keel.offboarded receipt is enough: with every Redis key of the namespace lost (the offboarded
    set included), a worker that re-applies the log, and `keel replay --all`, each record the tenant as
    offboarded again and keep none of its keys; the other tenant's graph is rebuilt as it was. The key store
    refuses to create a key for the tenant again."""
    import redis as redis_client
    from support.workers import wait_until

    env = keyed_env
    folder = unique_clinic(tmp_path)
    name = load_cartridge(folder).name
    keel("publish", str(folder), str(write_lines(tmp_path / "clear.jsonl", STREAM)), "--partitions", "2", env=env)
    redis = ["--redis", env["KEEL_REDIS_URL"]]
    worker = WorkerProcess([folder], env, tmp_path / "worker.log")
    try:
        wait_applied(folder, env, len(STREAM), worker)
        keel("offboard", str(folder), *redis, "--kafka", env["KEEL_KAFKA_BOOTSTRAP"], "--tenant", "t2", env=env)
        wait_applied(folder, env, len(STREAM) + 1, worker)
        before = redis_digests(folder, env, ["t1"])
    finally:
        assert worker.terminate() == 0
    client = redis_client.Redis.from_url(env["KEEL_REDIS_URL"])

    def lose_everything() -> None:
        lost = list(client.scan_iter(match=f"keel:{{{name}*", count=1000))
        assert f"keel:{{{name}}}:offboarded".encode() in lost
        client.unlink(*lost)

    def t2_is_gone() -> bool:
        record = client.hget(f"keel:{{{name}}}:offboarded", "t2") or b""
        return b'"dropped": true' in record and not list(client.scan_iter(match=f"keel:{{{name}/t2}}*", count=1000))
    try:
        lose_everything()                   # a worker finds Redis empty and re-applies the log from its beginning
        worker = WorkerProcess([folder], env, tmp_path / "worker2.log")
        try:
            wait_until(lambda: redis_digests(folder, env, ["t1"]) == before and t2_is_gone(), 120,
                       "the worker to re-apply t1 and drop t2 again", on_timeout=worker.text)
        finally:
            assert worker.terminate() == 0
        lose_everything()                   # and `keel replay --all` does the same
        keel("replay", str(folder), "--all", "--quiet", *redis, env=env)
        assert redis_digests(folder, env, ["t1"]) == before
        assert t2_is_gone()
    finally:
        client.close()
    status = keel("status", str(folder), *redis, env=env, check=False).stdout
    assert "offboarded: t2 at" in status
    again = write_lines(tmp_path / "again.jsonl", [STREAM[5]])
    refused = keel("publish", str(folder), str(again), env=env, check=False)
    assert refused.returncode == 2 and "tenant 't2' was offboarded at" in refused.stderr


def test_offboard_embedded_drops_the_tenant_and_refuses_its_later_lines(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch,
                                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import json

    monkeypatch.setenv("KEEL_MASTER_KEY", base64.b64encode(MASTER).decode())
    monkeypatch.delenv("KEEL_MASTER_KEY_FILE", raising=False)
    folder = write_cartridge(tmp_path / "c")
    clear, sealed, keys = write_lines(tmp_path / "clear.jsonl", STREAM), tmp_path / "sealed.jsonl", tmp_path / "k.json"
    assert main(["seal", str(folder), str(clear), str(sealed), "--keys", str(keys)]) == 0
    offboard = ["offboard", str(folder), "--events", str(sealed), "--keys", str(keys), "--tenant", "t2"]
    assert main(offboard) == 0
    assert "tenant t2: offboarded (1 key deleted)" in capsys.readouterr().out
    assert main(offboard) == 0
    assert "tenant t2: already offboarded at" in capsys.readouterr().out
    receipt = json.loads(sealed.read_text(encoding="utf-8").splitlines()[-1])
    assert receipt["type"] == "keel.offboarded" and receipt["payload"] == {"keys": 1}
    assert json.loads(keys.read_text())["offboarded"][0]["tenant"] == "t2"
    assert not [k for k in json.loads(keys.read_text())["keys"].values() if k["tenant"] == "t2"]
    with sealed.open("a", encoding="utf-8") as f:       # a later line of t2, sealed before: refused
        f.write(sealed.read_text(encoding="utf-8").splitlines()[5] .replace('"e6"', '"e60"') + "\n")
    assert main(["digest", str(folder), str(sealed), "--keys", str(keys), "--tenant", "t2"]) == 1
    err = capsys.readouterr().err
    assert "unknown tenant 't2'" in err and "event e60: tenant 't2' was offboarded at" in err
    assert main(["digest", str(folder), str(sealed), "--keys", str(keys), "--tenant", "t1"]) == 0
    assert main(["offboard", str(folder), "--events", str(sealed), "--tenant", "t1"]) == 2     # keys needed
    assert "give its key file" in capsys.readouterr().err
