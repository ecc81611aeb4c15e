"""The tool surface: five tools, fixed order, byte-identical everywhere (golden file), hints, size."""
from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import anyio
import pytest
import yaml
from support.mcp_sessions import (
    FINANCE,
    KEEL,
    ROOT,
    TENANT_A,
    TENANT_B,
    add_tenant_b,
    canonical_tools,
    copy_finance,
    golden_text,
    memory_session,
    sorted_json,
)

from keel.cartridge import load_cartridge
from tools_server.backend import Backend
from tools_server.config import Identity, ServerConfig
from tools_server.server import build_server
from tools_server.surface import SPECS, TOKEN_GOAL, TOOL_NAMES, approx_tokens, tools_json

CARTRIDGES = sorted(p.parent for p in (ROOT / "cartridges").glob("*/cartridge.yaml"))

@pytest.fixture
def finance_events(tmp_path: Path) -> Path:
    return copy_finance(tmp_path)


@pytest.fixture
def two_tenant_events(tmp_path: Path) -> Path:
    return add_tenant_b(copy_finance(tmp_path))


def listed(cartridge_dir: Path, events: Path, identity: Identity, *, modern: bool = True) -> str:
    """tools/list as a client receives it from a freshly built server."""
    backend = Backend.embedded(load_cartridge(cartridge_dir), events)
    server = build_server(ServerConfig(backend, identity=identity))

    async def go() -> str:
        async with memory_session(server, modern=modern) as session:
            return canonical_tools((await session.list_tools()).tools)
    return anyio.run(go)


def test_surface_is_the_golden_file() -> None:
    assert tools_json() == golden_text()


def test_keel_tools_json_prints_the_golden_file() -> None:
    out = subprocess.run([*KEEL, "tools", "--json"], cwd=str(ROOT), capture_output=True, text=True, check=True)
    assert out.stdout.rstrip("\n") == golden_text()
    assert re.search(r"≈ \d+ tokens \(goal ≤ 1500\)", out.stderr)


def test_keel_tools_human_form_shows_size() -> None:
    out = subprocess.run([*KEEL, "tools"], cwd=str(ROOT), capture_output=True, text=True, check=True)
    assert [line.split()[0] for line in out.stdout.splitlines() if line and not line.startswith(" ")][:5] == \
        list(TOOL_NAMES)
    assert "tokens (goal ≤ 1500)" in out.stdout


def test_tools_list_identical_across_tenants_cartridges_and_restarts(two_tenant_events: Path) -> None:
    seen = {listed(FINANCE, two_tenant_events, Identity(TENANT_A, "a1", "t1")),
            listed(FINANCE, two_tenant_events, Identity(TENANT_B)),
            listed(FINANCE, two_tenant_events, Identity(TENANT_A, "a1", "t1"))}     # a restart
    for folder in CARTRIDGES:
        tenant = json.loads((folder / "events.jsonl").read_text().splitlines()[0])["tenant"]
        seen.add(listed(folder, folder / "events.jsonl", Identity(tenant)))
    assert seen == {golden_text()}


def test_handshake_era_clients_get_the_same_tools(two_tenant_events: Path) -> None:
    legacy = {listed(FINANCE, two_tenant_events, Identity(TENANT_A), modern=False),
              listed(FINANCE, two_tenant_events, Identity(TENANT_B), modern=False),
              listed(CARTRIDGES[-1], CARTRIDGES[-1] / "events.jsonl",
                     Identity(json.loads((CARTRIDGES[-1] / "events.jsonl").read_text().splitlines()[0])["tenant"]),
                     modern=False)}
    assert len(legacy) == 1
    assert sorted_json(legacy.pop()) == sorted_json(golden_text())


def test_tools_list_carries_a_long_public_cache_hint(finance_events: Path) -> None:
    server = build_server(ServerConfig(Backend.embedded(load_cartridge(FINANCE), finance_events),
                                       identity=Identity(TENANT_A)))

    async def go() -> None:
        async with memory_session(server, modern=True) as session:
            result = await session.list_tools()
            assert result.cache_scope == "public" and result.ttl_ms >= 3600_000
    anyio.run(go)


def test_five_tools_in_fixed_order_with_hints() -> None:
    assert tuple(s.name for s in SPECS) == TOOL_NAMES == ("context", "history", "search", "annotate", "related")
    for spec in SPECS:
        a = spec.annotations
        assert a.open_world_hint is False
        if spec.name == "annotate":
            assert a.read_only_hint is False and a.destructive_hint is False
        else:
            assert a.read_only_hint is True
        assert spec.input_schema["type"] == "object" and spec.output_schema["type"] == "object"
        for name, prop in spec.input_schema["properties"].items():
            assert prop.get("description"), f"{spec.name}.{name} has no description"
    known = {"known_through", "applied_through", "lag", "lag_measured_at"}     # docs/contracts.md
    assert set(SPECS[4].output_schema["properties"]) == {"entity", "relations"} | known
    assert all(known <= set(s.output_schema["properties"]) for s in SPECS)


def test_descriptions_are_short_distinct_and_domain_free() -> None:
    descriptions = [s.description for s in SPECS]
    assert len(set(descriptions)) == 5
    assert all(len(d) <= 300 and "Use it" in d for d in descriptions)
    text = tools_json().lower()
    forbidden = {"hogar", "otro", "finance", "fleet", "salon", "visa", "cop"}
    for folder in CARTRIDGES:
        spec = yaml.safe_load((folder / "cartridge.yaml").read_text())
        forbidden |= set(spec.get("entities", {})) | set(spec.get("relations", {})) | set(spec.get("rules", {}))
        for line in (folder / "events.jsonl").read_text().splitlines():
            forbidden.add(json.loads(line)["tenant"])
    words = set(re.findall(r"[a-z0-9_-]+", text))
    assert not (words & {w.lower() for w in forbidden}), words & forbidden
    assert not re.search(r"\b20\d\d-\d\d-\d\d\b", text.replace("yyyy-mm-dd", ""))


def test_surface_fits_the_token_goal() -> None:
    compact = tools_json(indent=None)
    assert approx_tokens(compact) <= TOKEN_GOAL, approx_tokens(compact)
