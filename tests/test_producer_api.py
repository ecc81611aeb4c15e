"""Producers that publish to Kafka themselves (issue 24; docs/privacy.md): `keel.sealer` for Python, and
`keel data-key` for a producer in another language, which seals from the documented wire format alone."""
from __future__ import annotations

import base64
import json
import os
import struct
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from test_privacy import MASTER, SECRET_NAME, STREAM, plaintext_forms, store_at, write_cartridge

import keel
from keel.cartridge import load_cartridge
from keel.cli import main
from keel.errors import EnvelopeRejected, UsageError
from keel.privacy import Privacy, is_encrypted


@pytest.fixture
def master_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KEEL_MASTER_KEY", base64.b64encode(MASTER).decode())
    for name in ("KEEL_MASTER_KEY_FILE", "KEEL_KEYS_DSN", "KEEL_KEYS_FILE"):
        monkeypatch.delenv(name, raising=False)


def test_the_python_producer_api_checks_and_seals(tmp_path: Path, master_env: None) -> None:
    folder = write_cartridge(tmp_path / "clinic")
    keys = tmp_path / "keys.json"
    with keel.sealer(folder, keys_file=keys) as sealer:
        key, value = sealer.record(STREAM[0])
        assert key == b"t1" and sealer.topic == load_cartridge(folder).topic
        sent = json.loads(value)
        assert is_encrypted(sent["payload"]["name"]) and sent["payload"]["channel"] == "web"
        assert "recorded_at" not in sent                  # left to the topic's log-append time, as given
        for form in plaintext_forms(SECRET_NAME):
            assert form not in value
        wrong = {**STREAM[0], "payload": {**STREAM[0]["payload"], "name": 42}}
        with pytest.raises(EnvelopeRejected) as refused:
            sealer.record(wrong)
        assert "personal data, not shown" in refused.value.reason and "42" not in refused.value.reason
        assert sealer.seal(sent) == sent                   # already sealed: kept
    assert Privacy(load_cartridge(folder), store_at(keys)).reveal(sent)["payload"] == STREAM[0]["payload"]
    with pytest.raises(UsageError, match="keys_dsn= or keys_file="):
        keel.sealer(folder)


def field_ad(tenant: str, subject: str, event_id: str, field: str) -> bytes:
    """The associated data as docs/privacy.md writes it down (not keel.privacy's function)."""
    out = b"keel.enc/v1"
    for part in (tenant, subject, event_id, field):
        data = part.encode()
        out += struct.pack(">I", len(data)) + data
    return out


def test_a_producer_in_another_language_seals_with_a_handed_out_key(tmp_path: Path, master_env: None,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    folder = write_cartridge(tmp_path / "clinic")
    keys = tmp_path / "keys.json"
    assert main(["data-key", str(folder), "--tenant", "t1", "--subject", "client:c1", "--keys", str(keys)]) == 0
    handed = json.loads(capsys.readouterr().out)
    assert (handed["tenant"], handed["subject"], handed["alg"]) == ("t1", "client:c1", "AES-256-GCM")
    assert main(["data-key", str(folder), "--tenant", "t1", "--subject", "client:c1", "--keys", str(keys)]) == 0
    assert json.loads(capsys.readouterr().out)["kid"] == handed["kid"]      # the same key, not a new one each time
    data_key = base64.b64decode(handed["key"])
    envelope = json.loads(json.dumps(STREAM[0]))
    for name in ("name", "phone"):
        iv = os.urandom(12)
        plain = json.dumps(envelope["payload"][name], ensure_ascii=False, separators=(",", ":")).encode()
        ct = AESGCM(data_key).encrypt(iv, plain, field_ad("t1", "client:c1", envelope["id"], name))
        envelope["payload"][name] = {"keel.enc": "v1", "kid": handed["kid"], "iv": base64.b64encode(iv).decode(),
                                     "ct": base64.b64encode(ct).decode()}
    privacy = Privacy(load_cartridge(folder), store_at(keys))
    assert privacy.reveal(envelope)["payload"] == STREAM[0]["payload"]
    assert main(["data-key", str(folder), "--tenant", "t1", "--subject", "c1", "--keys", str(keys)]) == 2
    assert "type:id" in capsys.readouterr().err
