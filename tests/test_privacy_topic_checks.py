"""Issue 40: one key store per deployment on the Kafka path. `keel validate --kafka` and `keel diff --kafka` read
the cartridge's topic, whose personal fields `keel publish` sealed with the deployment's key store; they decrypt
with that same store (`--keys-dsn` / KEEL_KEYS_DSN, as the workers take it), not only with a key file."""
from __future__ import annotations

from pathlib import Path

from support.workers import keel, services
from test_privacy import STREAM, write_lines
from test_privacy_kafka import keyed_env, unique_clinic  # noqa: F401 - keyed_env is a fixture used below


@services
def test_validate_and_diff_read_the_sealed_topic_with_the_deployments_key_store(
        tmp_path: Path, keyed_env: dict[str, str]) -> None:  # noqa: F811 - the fixture
    env = keyed_env
    folder = unique_clinic(tmp_path)
    keel("publish", str(folder), str(write_lines(tmp_path / "clear.jsonl", STREAM)), "--partitions", "2", env=env)
    checked = keel("validate", str(folder), "--kafka", env=env)                  # KEEL_KEYS_DSN, as the workers
    assert f"{len(STREAM)} events ok" in checked.stdout, checked.stderr
    diffed = keel("diff", str(folder), str(folder), "--kafka", env=env)
    assert "2 tenant(s), 0 whose graph changes" in diffed.stdout and diffed.stderr == "", diffed.stderr
    given = keel("validate", str(folder), "--kafka", "--keys-dsn", env["KEEL_KEYS_DSN"],
                 env={**env, "KEEL_KEYS_DSN": ""})                                  # or given by flag
    assert f"{len(STREAM)} events ok" in given.stdout
    without = keel("validate", str(folder), "--kafka", env={**env, "KEEL_KEYS_DSN": ""}, check=False)
    assert without.returncode == 2 and "encrypted personal data; give the key file" in without.stderr
    clear = keel("validate", str(folder), "--kafka", "--clear", env=env, check=False)
    assert clear.returncode == 2 and "the Kafka/Redis path never takes them in clear" in clear.stderr
