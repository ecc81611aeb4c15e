"""What the deploy path relies on, checked without a container engine: the tokens file `keel token --tokens`
writes can be read by the image's user (uid 10001) from a bind mount, and the images' names (their tag) come
from one place, deploy/engine, which compose.yaml's defaults, Containerfile.cartridge, the kustomize base and
the docs agree with."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

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


# ---- one tag: deploy/engine names the images, everything else agrees ---------------------------------------

NOT_IMAGES = {"keel:keel", "keel:read", "keel:write"}   # chown keel:keel; the OAuth scopes of keel serve
IMAGE = re.compile(r"(?<![\w./-])(keel(?:-kafka|-redis|-postgres)?):([A-Za-z0-9][\w.-]*)")
DOCS = ["README.md", "docs/production.md", "deploy/README.md", "deploy/Containerfile", "deploy/Containerfile.cartridge",
        "deploy/compose.yaml"]


def engine_names() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "KEEL_IMAGE_TAG"}
    out = subprocess.run([str(ROOT / "deploy" / "engine"), "names"], check=True, capture_output=True, text=True,
                         env=env).stdout
    return dict(line.split("=", 1) for line in out.split())


def test_the_engine_names_four_images_with_one_tag() -> None:
    names = engine_names()
    assert names == {"KEEL_IMAGE": "keel:local", "KEEL_KAFKA_IMAGE": "keel-kafka:local",
                     "KEEL_REDIS_IMAGE": "keel-redis:local", "KEEL_POSTGRES_IMAGE": "keel-postgres:local"}
    tagged = subprocess.run([str(ROOT / "deploy" / "engine"), "names"], check=True, capture_output=True, text=True,
                            env={**os.environ, "KEEL_IMAGE_TAG": "1.2.3"}).stdout.split()
    assert tagged == ["KEEL_IMAGE=keel:1.2.3", "KEEL_KAFKA_IMAGE=keel-kafka:1.2.3", "KEEL_REDIS_IMAGE=keel-redis:1.2.3",
                      "KEEL_POSTGRES_IMAGE=keel-postgres:1.2.3"]


def test_compose_defaults_are_the_engines_names() -> None:
    text = (ROOT / "deploy" / "compose.yaml").read_text()
    defaults = dict(re.findall(r"\$\{(KEEL_(?:[A-Z]+_)?IMAGE):-([^}]+)\}", text))
    # Kafka Connect (the `cdc` profile, not started by default) is Debezium's own image, not one the engine builds
    assert defaults.pop("KEEL_CONNECT_IMAGE") == "quay.io/debezium/connect:3.6.1.Final"
    assert defaults == engine_names()


def test_the_cartridge_image_and_the_kustomize_base_start_from_the_engines_keel_image() -> None:
    keel = engine_names()["KEEL_IMAGE"]
    cartridge_file = (ROOT / "deploy" / "Containerfile.cartridge").read_text()
    arg = re.search(r"^ARG KEEL_IMAGE=(\S+)$", cartridge_file, re.MULTILINE)
    assert arg and arg.group(1) == keel
    base = yaml.safe_load((ROOT / "deploy" / "k8s" / "base" / "kustomization.yaml").read_text())
    [image] = [i for i in base["images"] if i["name"] == "keel"]
    assert f"{image['newName']}:{image['newTag']}" == keel


def test_the_docs_name_the_images_as_the_engine_does() -> None:
    names = set(engine_names().values())
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        other = {f"{m[0]}:{m[1]}" for m in IMAGE.findall(text)} - names - NOT_IMAGES
        assert not other, f"{doc} names {sorted(other)}; deploy/engine names {sorted(names)}"
        untagged = re.findall(r"-t keel(?:-kafka|-redis|-postgres)?(?=\s)", text)
        assert not untagged, f"{doc}: `docker build {untagged[0]}` tags :latest, not deploy/engine's tag"
