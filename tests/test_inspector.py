"""`keel inspect`: the read-only inspector page, over HTTP from a real `keel inspect` process.

What the page shows is what the tools answer (the same file opened with `keel.open` gives the expected values),
every rectangle of the bitemporal pictures is one version of `history`, everything stored is escaped, nothing
but GET is served, Host names outside loopback are refused, and with a tokens file (the one of `keel serve`)
a caller sees only the tenant of its token. The chart's geometry is checked without a server. The browser test
is tests/test_inspector_browser.py; on Redis, test_inspect_on_redis.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from html import unescape
from pathlib import Path
from typing import Any

import pytest

import keel
from inspector.chart import Axis, Scale, Span, chart
from keel.cartridge import load_cartridge
from keel.embedded import replay_file
from keel.projector import Projector
from keel.times import parse_time
from keel.tokens import Identity
from tools_server.tokens import append_entry, new_token, token_entry

ROOT = Path(__file__).resolve().parents[1]
FINANCE = ROOT / "cartridges" / "finance"
TENANT = "hogar-demo"
KEEL = [sys.executable, "-m", "keel.cli"]


# ---- a real `keel inspect` process ------------------------------------------------------------------------

@dataclass
class Page:
    status: int
    headers: dict[str, str]
    body: str


@dataclass
class Inspect:
    proc: subprocess.Popen[bytes]
    port: int
    err: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, *, host: str | None = None, headers: dict[str, str] | None = None,
                body: bytes | None = None) -> Page:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            sent = {"Host": host or f"127.0.0.1:{self.port}", **(headers or {})}
            conn.request(method, path, body=body, headers=sent)
            reply = conn.getresponse()
            return Page(reply.status, {k.lower(): v for k, v in reply.getheaders()},
                        reply.read().decode("utf-8"))
        finally:
            conn.close()

    def get(self, path: str, **options: Any) -> Page:
        return self.request("GET", path, **options)

    def stderr(self) -> str:
        return self.err.read_text(encoding="utf-8", errors="replace")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def inspector_server(tmp_path: Path, *args: str) -> Iterator[Inspect]:
    """`keel inspect ARGS` on a free loopback port until /healthz answers; stopped by its pid at exit."""
    port = free_port()
    err = tmp_path / f"inspect-{port}.err"
    with err.open("wb") as stderr:
        proc = subprocess.Popen([*KEEL, "inspect", *args, "--port", str(port)], cwd=str(ROOT),
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=stderr)
    server = Inspect(proc, port, err)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"keel inspect exited {proc.returncode}:\n{server.stderr()}")
            try:
                if server.get("/healthz").status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"keel inspect did not start:\n{server.stderr()}")
            time.sleep(0.1)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def finance_copy(tmp_path: Path) -> Path:
    events = tmp_path / "events.jsonl"
    shutil.copy(FINANCE / "events.jsonl", events)
    return events


def version_counts(history: dict[str, Any]) -> Counter[str]:
    """Versions per timeline of a history result, keyed as the page names its charts."""
    entity = history["entity"]
    counts: Counter[str] = Counter()
    for v in history["versions"]:
        counts[v["predicate"] if v["scope"] is None else f"{v['predicate']} (note, {v['scope']})"] += 1
    for v in history["labels"]:
        counts[f"{v['label']} (label)"] += 1
    for v in history["relations"]:
        if v["subject"] == entity:
            counts[f"{v['relation']} → {v['object']}"] += 1
        else:
            counts[f"{v['subject']} → {v['relation']}"] += 1
    return counts


def chart_counts(html: str) -> Counter[str]:
    """Rectangles per chart of an entity page: `<svg … data-timeline="K">` … `<rect class="version …">`."""
    counts: Counter[str] = Counter()
    for key, body in re.findall(r'<svg class="bitemporal".*?data-timeline="([^"]*)".*?>(.*?)</svg>', html, re.DOTALL):
        counts[unescape(key)] = len(re.findall(r'<rect class="version[ "]', body))
    return counts


def fact_cell(html: str, predicate: str) -> str:
    """The value cell of a fact row of the entity page's facts table."""
    found = re.search(rf'<tr data-predicate="{re.escape(predicate)}">.*?<td class="value">(.*?)</td>', html, re.DOTALL)
    assert found, f"no {predicate} row"
    return unescape(found.group(1)).strip()


# ---- the pages, embedded ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Inspect, Path]]:
    """The finance sample with a tenant note whose value is markup, and an agent note of agent `debts`."""
    tmp = tmp_path_factory.mktemp("inspect")
    events = finance_copy(tmp)
    with keel.open(FINANCE, events=events) as graph:
        tools = graph.tools(tenant=TENANT, agent="debts")
        tools.annotate("debt:visa", "next_step", "<script>alert(1)</script> & \"prepay\"", "tenant",
                       evidence="snap-visa-2026-10")
        tools.annotate("debt:visa", "private", "only debts sees this", "agent")
    with inspector_server(tmp, str(FINANCE), "--events", str(events)) as server:
        yield server, events


def test_the_picker_lists_the_tenants_and_search_is_the_tool(served: tuple[Inspect, Path]) -> None:
    server, events = served
    index = server.get("/")
    assert index.status == 200 and f'href="/c/finance/t/{TENANT}"' in index.body
    page = server.get(f"/c/finance/t/{TENANT}?q=visa")
    with keel.open(FINANCE, events=events) as graph:
        expected = graph.tools(tenant=TENANT).search("visa", limit=25)
    found = re.findall(r'<a class="entity" href="([^"]+)">([^<]+)</a>', page.body)
    assert [name for _, name in found] == [hit["entity"] for hit in expected["results"]]
    assert (f"/c/finance/t/{TENANT}/e/debt:visa", "debt:visa") in found
    assert expected["message"] in page.body
    then = server.get(f"/c/finance/t/{TENANT}?q=visa&at=2026-08-01")       # names as they were: none yet
    assert "no entities match" in unescape(then.body) and 'class="entity"' not in then.body


def test_the_entity_view_is_what_the_tools_answer(served: tuple[Inspect, Path]) -> None:
    server, events = served
    with keel.open(FINANCE, events=events) as graph:
        tools = graph.tools(tenant=TENANT)
        for at, known_at, balance in (("2026-10-02", "2026-10-02", 12180000), ("2026-10-02", "2026-10-05", 12150000)):
            page = server.get(f"/c/finance/t/{TENANT}/e/debt:libranza?at={at}&known_at={known_at}")
            assert page.status == 200
            context = tools.context("debt:libranza", at=at, known_at=known_at)
            shown = {f["predicate"]: f["value"] for f in context["facts"]}
            assert shown["balance_cop"] == balance
            for predicate, value in shown.items():
                assert fact_cell(page.body, predicate) == json.dumps(value)
            verdict = context["rules"]["debt_expensive"]
            assert verdict["holds"] is False and f"<code>{verdict['because'][0]}</code>" in page.body
            history = tools.history("debt:libranza", known_at=known_at)
            assert chart_counts(page.body) == version_counts(history)       # one rectangle per version
            rows = re.findall(r'<tr id="(v\d+)"', page.body)
            anchors = re.findall(r'data-anchor="(v\d+)"', page.body)
            assert sorted(anchors) == sorted(rows) and len(rows) == sum(version_counts(history).values())
        assert "corrected by human:ana" in page.body
        assert "superseded_by: snap-libranza-2026-10-fix" in page.body     # the replaced version's <title>
        # relations link to the related entities' views, keeping the view's times
        assert (f'href="/c/finance/t/{TENANT}/e/household:hogar-demo?at=2026-10-02&amp;known_at=2026-10-05"'
                in page.body)


def test_every_entity_of_the_sample_draws_one_rectangle_per_version(served: tuple[Inspect, Path]) -> None:
    server, events = served
    with keel.open(FINANCE, events=events) as graph:
        tools = graph.tools(tenant=TENANT)
        entities = {hit["entity"] for word in ("debt", "due", "account", "household")
                    for hit in tools.search(word, limit=100)["results"]}
        assert len(entities) > 10
        for entity in sorted(entities):
            page = server.get(f"/c/finance/t/{TENANT}/e/{entity}")
            assert page.status == 200, entity
            assert chart_counts(page.body) == version_counts(tools.history(entity)), entity


def test_stored_text_is_escaped_and_notes_follow_the_caller(served: tuple[Inspect, Path]) -> None:
    server, _ = served
    page = server.get(f"/c/finance/t/{TENANT}/e/debt:visa")
    assert "<script>" not in page.body
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; &#34;prepay&#34;" in page.body
    assert "only debts sees this" not in page.body       # an agent note: not for a caller without that agent
    assert page.headers["content-security-policy"].startswith("default-src 'none'")
    assert page.headers["x-content-type-options"] == "nosniff"


def test_errors_are_pages_with_the_tools_message(served: tuple[Inspect, Path]) -> None:
    server, _ = served
    bad_time = server.get(f"/c/finance/t/{TENANT}/e/debt:visa?at=yesterday")
    assert bad_time.status == 400 and "neither RFC 3339" in unescape(bad_time.body)
    unknown = server.get(f"/c/finance/t/{TENANT}/e/debt:nothing")
    assert unknown.status == 404 and "debt:nothing" in unknown.body
    bad_type = server.get(f"/c/finance/t/{TENANT}/e/ship:x")
    assert bad_type.status == 400 and "is not an entity type" in bad_type.body
    assert server.get("/c/finance/t/nobody/e/debt:visa").status == 404
    assert server.get("/c/fleet/t/x").status == 404
    before = server.get(f"/c/finance/t/{TENANT}/e/debt:libranza?known_at=2026-08-01")     # not known yet
    assert before.status == 404


def test_read_only_and_host_checked(served: tuple[Inspect, Path]) -> None:
    server, events = served
    lines = events.read_text(encoding="utf-8")
    for method in ("POST", "PUT", "DELETE"):
        assert server.request(method, f"/c/finance/t/{TENANT}/e/debt:visa", body=b"x").status == 405
    assert events.read_text(encoding="utf-8") == lines
    assert server.get("/", host="evil.example").status == 400           # DNS rebinding
    assert server.get("/", host=f"localhost:{server.port}").status == 200
    assert server.get("/login").status == 303                            # no tokens asked: nothing to sign in to


def test_agent_flag_shows_that_agents_notes(tmp_path: Path, served: tuple[Inspect, Path]) -> None:
    _, events = served
    with inspector_server(tmp_path, str(FINANCE), "--events", str(events), "--agent", "debts") as server:
        assert "only debts sees this" in server.get(f"/c/finance/t/{TENANT}/e/debt:visa").body


# ---- tokens --------------------------------------------------------------------------------------------------

def test_tokens_bind_the_tenant(tmp_path: Path) -> None:
    events = finance_copy(tmp_path)
    text = events.read_text(encoding="utf-8")
    events.write_text(text + text.replace(TENANT, "otro-hogar"), encoding="utf-8")
    tokens = tmp_path / "tokens.jsonl"
    mine, other = new_token(), new_token()
    append_entry(tokens, token_entry(mine, Identity(TENANT, "debts")))
    append_entry(tokens, token_entry(other, Identity("otro-hogar")))
    with inspector_server(tmp_path, str(FINANCE), "--events", str(events), "--tokens", str(tokens)) as server:
        visa = f"/c/finance/t/{TENANT}/e/debt:visa"
        assert server.get(visa).status == 401 and 'action="/login"' in server.get(visa).body
        assert server.get(visa, headers={"Authorization": "Bearer nope"}).status == 401
        bearer = {"Authorization": f"Bearer {mine}"}
        assert server.get(visa, headers=bearer).status == 200
        assert server.get("/c/finance/t/otro-hogar/e/debt:visa", headers=bearer).status == 403
        assert server.get("/c/finance/t/otro-hogar?q=visa", headers=bearer).status == 403
        index = server.get("/", headers=bearer).body
        assert f"/c/finance/t/{TENANT}" in index and "otro-hogar" not in index
        # a browser signs in with a form: the token goes into an HttpOnly, SameSite=Strict cookie
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        wrong = server.request("POST", "/login", headers=form, body=b"token=nope")
        assert wrong.status == 401
        foreign = server.request("POST", "/login", headers={**form, "Origin": "http://evil.example"},
                                 body=f"token={other}".encode())
        assert foreign.status == 403
        signed = server.request("POST", "/login", headers=form, body=f"token={other}".encode())
        assert signed.status == 303
        cookie = signed.headers["set-cookie"]
        assert "httponly" in cookie.lower() and "samesite=strict" in cookie.lower()
        jar = {"Cookie": cookie.split(";")[0]}
        assert server.get("/c/finance/t/otro-hogar/e/debt:visa", headers=jar).status == 200
        assert server.get(visa, headers=jar).status == 403
        assert mine not in server.stderr() and other not in server.stderr()


def test_beyond_loopback_needs_tokens_and_a_busy_port_is_exit_3(tmp_path: Path) -> None:
    events = finance_copy(tmp_path)
    out = run_inspect(str(FINANCE), "--events", str(events), "--host", "0.0.0.0")
    assert out.returncode == 2 and "give --tokens FILE" in out.stderr
    out = run_inspect(str(FINANCE), KEEL_REDIS_URL="")
    assert out.returncode == 2 and "--events FILE" in out.stderr
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        out = run_inspect(str(FINANCE), "--events", str(events), "--port", str(port))
    assert out.returncode == 3 and f"cannot listen on 127.0.0.1:{port}" in out.stderr


def run_inspect(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`keel inspect ARGS` to its end (a refusal), without a tokens file from the environment."""
    clean = {k: v for k, v in os.environ.items() if k != "KEEL_TOKENS_FILE"}
    return subprocess.run([*KEEL, "inspect", *args], cwd=str(ROOT), capture_output=True, text=True, timeout=120,
                          env={**clean, **env}, check=False)


# ---- on Redis -------------------------------------------------------------------------------------------------

def test_inspect_on_redis(tmp_path: Path, redis_url: str, private_finance: Path) -> None:
    """The same pages over the Redis graph the workers maintain (written here by the projector directly)."""
    from keel.store.redis import RedisStore
    tenant = f"hogar-{uuid.uuid4().hex[:8]}"
    events = tmp_path / "events.jsonl"
    events.write_text((FINANCE / "events.jsonl").read_text(encoding="utf-8").replace(TENANT, tenant),
                      encoding="utf-8")
    cartridge = load_cartridge(private_finance)
    name = cartridge.name
    store = RedisStore.from_url(redis_url, namespace=name)
    try:
        assert not replay_file(Projector(cartridge, store), events).rejected
        with inspector_server(tmp_path, str(private_finance), "--redis", redis_url, "--kafka", "127.0.0.1:1",
                              "--tenant", tenant) as server:
            assert f'href="/c/{name}/t/{tenant}"' in server.get("/").body
            for known_at, balance in (("2026-10-02", "12180000"), ("2026-10-05", "12150000")):
                page = server.get(f"/c/{name}/t/{tenant}/e/debt:libranza?at=2026-10-02&known_at={known_at}")
                assert page.status == 200 and fact_cell(page.body, "balance_cop") == balance
            with keel.open(FINANCE, events=events) as graph:
                history = graph.tools(tenant=tenant).history("debt:libranza")
            assert chart_counts(server.get(f"/c/{name}/t/{tenant}/e/debt:libranza").body) == version_counts(history)
    finally:
        store.drop_namespace()
        store.close()


# ---- the picture's geometry -----------------------------------------------------------------------------------

def _span(anchor: str, valid: tuple[str, str | None], recorded: tuple[str, str | None]) -> Span:
    return Span(anchor, anchor, anchor, parse_time(valid[0]), None if valid[1] is None else parse_time(valid[1]),
                parse_time(recorded[0]), None if recorded[1] is None else parse_time(recorded[1]))


def test_the_axes_are_spaced_by_change() -> None:
    axis = Axis(tuple(parse_time(t) for t in ("2026-09-01", "2026-10-01", "2027-10-01")), True)
    assert [axis.fraction(parse_time(t)) for t in ("2026-09-01", "2026-10-01", "2027-10-01")] == [0, 1 / 3, 2 / 3]
    assert axis.fraction(None) == 1.0 and axis.fraction(parse_time("2030-01-01")) == 1.0
    assert 1 / 3 < axis.fraction(parse_time("2027-04-01")) < 2 / 3


def test_a_correction_is_a_rectangle_cut_by_the_one_that_replaced_it() -> None:
    spans = [_span("old", ("2026-10-01", "2026-11-01"), ("2026-10-01", "2026-10-04T09:00:00Z")),
             _span("fix", ("2026-10-01", "2026-11-01"), ("2026-10-04T09:00:00Z", None)),
             _span("next", ("2026-11-01", None), ("2026-11-01", None))]
    picture = chart("balance_cop", spans, Scale.of(spans, None, None), at=None, known_at=None)
    old, fix, nxt = picture.boxes
    assert len(picture.boxes) == 3
    assert (old.x, old.w) == (fix.x, fix.w)                          # the same validity
    assert old.y == fix.y + fix.h                                    # the fix starts where the old one stops
    assert fix.y == picture.plot[1] and nxt.y == picture.plot[1]      # believed: up to the top
    assert nxt.x + nxt.w == picture.plot[2] and nxt.open_right        # open: to the right edge
    assert "superseded" in old.classes and "believed" in fix.classes
    believed = [_span("old", ("2026-10-01", None), ("2026-10-01", None))]    # history as known on 2 October
    known = parse_time("2026-10-02")
    then = chart("b", believed, Scale.of(believed, None, known), at=None, known_at=known)
    (box,) = then.boxes
    assert then.known_y is not None and box.y < then.known_y < box.y + box.h     # believed then, and on
    recorded_then = [_span("new", ("2026-10-01", None), ("2026-10-02", None))]  # recorded at known_at itself
    (box,) = chart("c", recorded_then, Scale.of(recorded_then, None, known), at=None, known_at=known).boxes
    assert box.h > 20                                                        # still a visible rectangle
