"""A private PostgreSQL server for tests that stop and start it (the shared one is never stopped): initdb in a
temporary folder, pg_ctl start/stop on a free loopback port, as deploy/local/services starts the shared one."""
from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for d in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (d / name).exists():
            return str(d / name)
    return None


def _as_owner(cmd: list[str]) -> list[str]:
    """PostgreSQL refuses to run as root: run its binaries as user postgres then."""
    if os.getuid() == 0:
        return ["runuser", "-u", "postgres", "--", *cmd]
    return cmd


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivatePostgres:
    def __init__(self, folder: Path, port: int, pg_ctl: str, settings: str = "") -> None:
        self.settings = settings          # more `-c name=value` server settings (the cdc tier: wal_level=logical)
        self.folder = folder
        self.data = folder / "data"
        self.port = port
        self.pg_ctl = pg_ctl
        self.dsn = f"postgresql://postgres@127.0.0.1:{port}/postgres"

    def start(self) -> None:
        subprocess.run(_as_owner([self.pg_ctl, "-D", str(self.data), "-l", str(self.folder / "log"), "-w", "-t", "60",
                                  "-o", (f"-c listen_addresses=127.0.0.1 -p {self.port} "
                                        f"-c unix_socket_directories={self.folder} -c fsync=off {self.settings}"), "start"]),
                       check=True, capture_output=True, stdin=subprocess.DEVNULL)

    def stop(self) -> None:
        subprocess.run(_as_owner([self.pg_ctl, "-D", str(self.data), "-m", "immediate", "-w", "-t", "60", "stop"]),
                       check=False, capture_output=True, stdin=subprocess.DEVNULL)


@contextmanager
def private_postgres(settings: str = "") -> Iterator[PrivatePostgres]:
    """A started private server, stopped and deleted at the end; skipped where PostgreSQL's binaries are absent."""
    import pytest
    initdb, pg_ctl = _bin("initdb"), _bin("pg_ctl")
    if initdb is None or pg_ctl is None:
        pytest.skip("PostgreSQL binaries (initdb, pg_ctl) not found")
    folder = Path(tempfile.mkdtemp(prefix="keel-pg-"))
    if os.getuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(folder, pw.pw_uid, pw.pw_gid)
        folder.chmod(0o700)
    server = PrivatePostgres(folder, _free_port(), pg_ctl, settings)
    try:
        subprocess.run(_as_owner([initdb, "-D", str(server.data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                                  "--locale=C"]), check=True, capture_output=True, stdin=subprocess.DEVNULL)
        server.start()
        yield server
    finally:
        server.stop()
        shutil.rmtree(folder, ignore_errors=True)
