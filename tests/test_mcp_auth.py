"""Units of the HTTP side: the tokens file, `keel token`, Host/Origin settings, the metrics text."""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import anyio
import pytest
from support.mcp_sessions import KEEL, ROOT

from keel.errors import UsageError
from tools_server.auth import TokenFileVerifier
from tools_server.config import Identity, ServerConfig
from tools_server.http import security_settings
from tools_server.observe import Metrics, Observer
from tools_server.tokens import TokenTable, hash_token, new_token, token_entry


def write(path: Path, *lines: object) -> Path:
    path.write_text("".join((x if isinstance(x, str) else json.dumps(x)) + "\n" for x in lines))
    return path


def test_token_table_round_trip(tmp_path: Path) -> None:
    t1, t2 = new_token(), new_token()
    assert t1 != t2 and len(t1) >= 40
    path = write(tmp_path / "t.jsonl", "# comment", "", token_entry(t1, Identity("acme", "bot", "q3")),
                 token_entry(t2, Identity("other")))
    table = TokenTable.load(path)
    assert len(table) == 2
    assert table.lookup(t1) == (hash_token(t1), Identity("acme", "bot", "q3"))
    assert table.lookup("nope") is None and table.lookup(t1 + " ") is None
    assert len(TokenTable.load(path, tenant="other")) == 1
    with pytest.raises(UsageError, match="no token for tenant"):
        TokenTable.load(path, tenant="nobody")
    access = anyio.run(TokenFileVerifier(table).verify_token, t1)
    assert access is not None and t1 not in access.model_dump_json()
    assert access.claims == {"keel_tenant": "acme", "keel_agent": "bot", "keel_task": "q3"}


@pytest.mark.parametrize("line, message", [
    ("not json", "not a JSON object"),
    (["a list"], "not a JSON object"),
    ({"token_sha256": "abc", "tenant": "acme"}, "64 lowercase hex"),
    ({"token": "plain", "token_sha256": "a" * 64, "tenant": "acme"}, "unknown field"),
    ({"token_sha256": "a" * 64, "tenant": "bad tenant!"}, "bad tenant"),
    ({"token_sha256": "a" * 64, "tenant": "acme\n"}, "bad tenant"),
    ({"token_sha256": "a" * 64}, "bad tenant"),
    ({"token_sha256": "a" * 64, "tenant": "acme", "agent": ""}, "bad agent"),
])
def test_bad_token_lines_name_the_line(tmp_path: Path, line: object, message: str) -> None:
    path = write(tmp_path / "t.jsonl", token_entry("x", Identity("acme")), line)
    with pytest.raises(UsageError, match=message) as e:
        TokenTable.load(path)
    assert ":2:" in str(e.value)


def test_duplicate_and_missing_files(tmp_path: Path) -> None:
    entry = token_entry("x", Identity("acme"))
    with pytest.raises(UsageError, match="twice"):
        TokenTable.load(write(tmp_path / "t.jsonl", entry, entry))
    with pytest.raises(UsageError, match="tokens file"):
        TokenTable.load(tmp_path / "missing.jsonl")


def test_keel_token_command(tmp_path: Path) -> None:
    out = subprocess.run([*KEEL, "token", "--tenant", "acme", "--agent", "bot"], cwd=str(ROOT),
                         capture_output=True, text=True, check=True)
    token, line = out.stdout.splitlines()
    assert json.loads(line) == {"token_sha256": hash_token(token), "tenant": "acme", "agent": "bot"}
    path = tmp_path / "tokens.jsonl"
    out = subprocess.run([*KEEL, "token", "--tenant", "acme", "--tokens", str(path), "--stdin"], cwd=str(ROOT),
                         input="my-secret\n", capture_output=True, text=True, check=True)
    assert out.stdout == "" and "my-secret" not in path.read_text()
    assert TokenTable.load(path).lookup("my-secret") is not None
    assert os.stat(path).st_mode & 0o777 == 0o644      # digests only; a container's user reads it


def test_security_settings() -> None:
    class Nothing:
        pass
    config = ServerConfig(Nothing(), identity=Identity("acme"), allow_hosts=("keel.example", "10.0.0.5:8765",
                                                                              "https://agents.example"))
    s = security_settings(config)
    assert s.enable_dns_rebinding_protection
    assert {"127.0.0.1:*", "localhost:*", "[::1]:*", "keel.example", "keel.example:*", "10.0.0.5:8765"} <= \
        set(s.allowed_hosts)
    assert "10.0.0.5:8765:*" not in s.allowed_hosts and "agents.example" not in s.allowed_hosts
    assert {"https://keel.example", "http://10.0.0.5:8765", "https://agents.example"} <= set(s.allowed_origins)


def test_metrics_text_format() -> None:
    observer = Observer(None, Metrics())
    observer.record("search", Identity("acme"), latency_s=0.0015, result_bytes=10, outcome="miss", miss=True)
    observer.record("search", None, latency_s=0.2, result_bytes=0, outcome="error", miss=False, error="UsageError")
    text = observer.metrics.render()
    assert 'keel_tool_calls_total{outcome="miss",tool="search"} 1.0' in text
    assert 'keel_tool_latency_seconds_bucket{le="0.001",tool="search"} 0.0' in text
    assert 'keel_tool_latency_seconds_bucket{le="0.002",tool="search"} 1.0' in text
    assert 'keel_tool_latency_seconds_bucket{le="+Inf",tool="search"} 2.0' in text
    assert 'keel_tool_latency_seconds_count{tool="search"} 2.0' in text
    assert 'keel_tool_result_bytes_total{tool="search"} 10.0' in text
    assert 'keel_retrieval_failures_total{tool="search"} 1.0' in text
    assert "acme" not in text and text.endswith("\n")
