"""Helpers for the replay and fault tests (no tests here): finance-shaped event files, publishing in the
background, `keel replay` as a subprocess, and a tenant's Redis key names."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from common import finance_events

from support.workers import ROOT, keel


def finance_file(path: Path, counts: dict[str, int], *, debts: int = 20, seed: int = 7) -> Path:
    """A JSONL file with `counts[tenant]` finance events per tenant, tenants interleaved line by line."""
    streams = []
    for i, (tenant, n) in enumerate(counts.items()):
        events = []
        for e in finance_events(n, 1, seed=seed + i, debts_per_tenant=debts):
            e = json.loads(json.dumps(e).replace("tenant-00000", tenant))
            events.append(e)
        streams.append(events)
    lines: list[str] = []
    longest = max(len(s) for s in streams)
    for j in range(longest):
        for s in streams:
            if j < len(s):
                lines.append(json.dumps(s[j]))
    path.write_text("\n".join(lines) + "\n")
    return path


def split_file(path: Path, parts: int) -> list[Path]:
    """The file cut into `parts` consecutive chunks (publishing them in order = publishing the file)."""
    lines = path.read_text().splitlines(keepends=True)
    size = -(-len(lines) // parts)
    out = []
    for i in range(parts):
        chunk = path.with_name(f"{path.stem}.part{i}.jsonl")
        chunk.write_text("".join(lines[i * size:(i + 1) * size]))
        out.append(chunk)
    return out


def count_lines(path: Path) -> int:
    return sum(1 for line in path.read_text().splitlines() if line.strip())


class BackgroundPublisher(threading.Thread):
    """Publishes files one after the other with `keel publish`, pausing between them."""

    def __init__(self, cartridge: Path, files: Iterable[Path], env: dict[str, str], pause_s: float = 0.3) -> None:
        super().__init__(daemon=True)
        self.cartridge, self.files, self.env, self.pause_s = cartridge, list(files), env, pause_s
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            for f in self.files:
                keel("publish", str(self.cartridge), str(f), "--quiet", env=self.env)
                time.sleep(self.pause_s)
        except (AssertionError, OSError, subprocess.SubprocessError) as e:   # the test reports `error`
            self.error = e


def replay_process(cartridge: Path, env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    """`keel replay` as a subprocess (to kill it)."""
    out = open(log, "ab")  # noqa: SIM115 - handed to the subprocess
    return subprocess.Popen([sys.executable, "-m", "keel.cli", "replay", str(cartridge), *args],
                            stdout=out, stderr=subprocess.STDOUT, env={**os.environ, **env}, cwd=ROOT)


def tenant_keys(redis_url: str, namespace: str, tenant: str) -> dict[str, Any]:
    """{key name: its value} of every Redis key of a tenant (its hash tag). Values are read by type (sets and
    hashes sorted), not DUMPed: a DUMP of a set or hash follows its hash table's order, which changes when
    Redis finishes an incremental rehash in the background, with nothing written."""
    import redis
    client = redis.Redis.from_url(redis_url)
    read = {b"string": client.get, b"list": lambda n: client.lrange(n, 0, -1),
            b"set": lambda n: sorted(client.smembers(n)), b"hash": lambda n: sorted(client.hgetall(n).items()),
            b"zset": lambda n: client.zrange(n, 0, -1, withscores=True)}
    try:
        names = sorted(k.decode() for k in client.scan_iter(match=f"keel:{{{namespace}/{tenant}}}:*", count=1000))
        return {n: (kind, read[kind](n)) for n in names for kind in [client.type(n)]}
    finally:
        client.close()
