"""`keel serve` over a sealed events file (issue 24; docs/privacy.md): with the key file the five tools answer with
the decrypted values; without it, the server says what to give instead of serving a graph with holes."""
from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from support.mcp_sessions import ok, stdio_session
from test_privacy import SECRET_NAME, master  # noqa: F401 - `master` is the fixture `sealed` uses
from test_privacy import sealed as sealed_file  # noqa: F401 - the fixture: a sealed clinic file and its key file

from keel.cli import main


def test_serve_reads_a_sealed_file_with_its_key_file(sealed_file: tuple[Path, Path, Path, Path],  # noqa: F811
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    folder, _, sealed, keys = sealed_file
    assert SECRET_NAME.encode() not in sealed.read_bytes()

    async def go() -> None:
        async with stdio_session(str(folder), str(sealed), "--keys", str(keys), "--tenant", "t1",
                                 "--no-call-log") as s:
            got = await ok(s, "context", {"entity": "client:c2"})
            assert got["labels"]["name"] == "Ana Ruiz"
            found = await ok(s, "search", {"query": "Ana Ruiz"})
            assert [hit["entity"] for hit in found["results"]][:1] == ["client:c2"]
    anyio.run(go)
    capsys.readouterr()
    assert main(["serve", str(folder), "--keys", str(keys), "--redis", "redis://127.0.0.1:1/0"]) == 2
    assert "--keys decrypts an events file" in capsys.readouterr().err


def test_inspect_reads_a_sealed_file_with_its_key_file(tmp_path: Path,
                                                       sealed_file: tuple[Path, Path, Path, Path]) -> None:  # noqa: F811
    import html

    from test_inspector import inspector_server
    folder, _, sealed, keys = sealed_file
    with inspector_server(tmp_path, str(folder), "--events", str(sealed), "--keys", str(keys)) as server:
        page = server.get("/c/clinic/t/t1/e/client:c1")
        assert page.status == 200
        assert html.escape(SECRET_NAME + " (2)") in page.body          # the latest name, decrypted
