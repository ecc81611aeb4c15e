"""What the deploy path relies on, checked without a container engine: the tokens file `keel token --tokens`
writes can be read by the image's user (uid 10001) from a bind mount."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tools_server.tokens import TokenTable

ROOT = Path(__file__).resolve().parents[2]
KEEL = [sys.executable, "-m", "keel.cli"]


def token(*args: str, umask: int = 0o077) -> subprocess.CompletedProcess:
    return subprocess.run([*KEEL, "token", "--tenant", "acme", *args], cwd=ROOT, capture_output=True, text=True,
                          check=False, umask=umask)


# ---- the tokens file ---------------------------------------------------------------------------------------

def test_a_new_tokens_file_is_readable_by_the_containers_user_whatever_the_umask(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    made = token("--tokens", str(path), umask=0o077)      # a strict umask would have made it 0600
    assert made.returncode == 0, made.stderr
    assert os.stat(path).st_mode & 0o777 == 0o644
    assert "warning" not in made.stderr
    secret = made.stdout.strip()
    assert secret not in path.read_text()                 # digests only: that is why 0644 is fine
    assert TokenTable.load(path).lookup(secret) is not None


def test_an_existing_file_the_container_cannot_read_gets_a_warning_and_keeps_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "tokens.jsonl"
    path.write_text("")
    path.chmod(0o600)                                     # as `keel token` made it before
    made = token("--tokens", str(path))
    assert made.returncode == 0, made.stderr
    assert os.stat(path).st_mode & 0o777 == 0o600         # the operator's choice is not changed behind their back
    if os.stat(path).st_uid != 10001:
        assert f"warning: {path} is mode 0600" in made.stderr and "uid 10001" in made.stderr
        assert f"chmod 644 {path}" in made.stderr
    assert len(TokenTable.load(path)) == 1


def test_a_tokens_file_that_cannot_be_written_is_refused_with_its_reason(tmp_path: Path) -> None:
    made = token("--tokens", str(tmp_path / "missing-folder" / "tokens.jsonl"))
    assert made.returncode == 2
    assert "No such file or directory" in made.stderr and "Traceback" not in made.stderr
    assert made.stdout == ""                              # no token printed for a line that was not written
