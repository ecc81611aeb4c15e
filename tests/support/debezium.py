"""The real capture chain of the cdc tier (no tests here): a private PostgreSQL with wal_level=logical (the
shared server is never reconfigured), the product's schema (examples/household), and Kafka Connect standalone
with the Debezium PostgreSQL connector (deploy/local/connect/connect), writing to the shared broker under a
unique topic prefix."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
HOUSEHOLD = ROOT / "examples" / "household"
CONNECT = ROOT / "deploy" / "local" / "connect" / "connect"
LOGICAL = "-c wal_level=logical -c max_replication_slots=8 -c max_wal_senders=8"
TABLES = "public.debts,public.dues,public.movements"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def logical_postgres() -> Iterator[object]:
    """A private PostgreSQL server with logical decoding (fails, never skips, under KEEL_REQUIRE_SERVICES)."""
    from support.private_pg import _bin, private_postgres
    if (_bin("initdb") is None or _bin("pg_ctl") is None) and os.environ.get("KEEL_REQUIRE_SERVICES") == "1":
        import pytest
        pytest.fail("the cdc tier needs PostgreSQL's initdb and pg_ctl (make test installs postgresql)")
    with private_postgres(LOGICAL) as server:
        yield server


def product_database(dsn: str) -> None:
    """The product's tables and what Debezium needs of them (examples/household: schema.sql, capture.sql)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute((HOUSEHOLD / "schema.sql").read_text())
        conn.execute((HOUSEHOLD / "capture.sql").read_text())


class Connect:
    """Kafka Connect standalone running the Debezium connector for one database and topic prefix."""

    def __init__(self, folder: Path, bootstrap: str, pg_port: int, prefix: str | None = None, *,
                 schemas: bool = False) -> None:
        self.schemas = schemas            # the JSON converter embeds each record's schema ({schema, payload})
        self.folder = folder
        self.bootstrap = bootstrap
        self.pg_port = pg_port
        self.prefix = prefix or f"cdc{uuid.uuid4().hex[:10]}"
        self.slot = f"keel_{self.prefix}"
        self.name = f"household-{self.prefix}"
        self.rest_port = _free_port()
        self.log = folder / "connect.log"
        self.proc: subprocess.Popen[bytes] | None = None
        folder.mkdir(parents=True, exist_ok=True)
        self.offsets = folder / "connect.offsets"

    def _write(self) -> tuple[Path, Path]:
        worker = self.folder / "worker.properties"
        worker.write_text("\n".join([
            f"bootstrap.servers={self.bootstrap}",
            "key.converter=org.apache.kafka.connect.json.JsonConverter",
            "value.converter=org.apache.kafka.connect.json.JsonConverter",
            f"key.converter.schemas.enable={str(self.schemas).lower()}",
            f"value.converter.schemas.enable={str(self.schemas).lower()}",
            f"offset.storage.file.filename={self.offsets}",
            "offset.flush.interval.ms=500",
            f"listeners=http://127.0.0.1:{self.rest_port}",
            "plugin.discovery=only_scan",
            ""]))
        connector = self.folder / "connector.properties"
        connector.write_text("\n".join([
            f"name={self.name}",
            "connector.class=io.debezium.connector.postgresql.PostgresConnector",
            "tasks.max=1",
            "database.hostname=127.0.0.1",
            f"database.port={self.pg_port}",
            "database.user=postgres",
            "database.password=unused",
            "database.dbname=postgres",
            f"topic.prefix={self.prefix}",
            "plugin.name=pgoutput",
            f"slot.name={self.slot}",
            "publication.name=keel_household",
            "publication.autocreate.mode=disabled",
            f"table.include.list={TABLES}",
            "decimal.handling.mode=string",
            "tombstones.on.delete=false",
            "snapshot.mode=initial",
            "heartbeat.interval.ms=1000",       # the slot's confirmed position follows the WAL when idle
            ""]))
        return worker, connector

    def start(self, timeout: float = 120) -> None:
        worker, connector = self._write()
        out = open(self.log, "ab")  # noqa: SIM115 - open for the life of the process
        self.proc = subprocess.Popen([str(CONNECT), "run", str(worker), str(connector)], stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=ROOT)
        out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"Kafka Connect exited {self.proc.returncode}:\n{self.tail()}")
            if self.state() == "RUNNING":
                return
            time.sleep(0.5)
        raise AssertionError(f"the Debezium connector was not RUNNING after {timeout}s:\n{self.tail()}")

    def state(self) -> str | None:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.rest_port}/connectors/{self.name}/status",
                                        timeout=2) as r:
                doc = json.load(r)
        except (OSError, ValueError):
            return None
        tasks = doc.get("tasks") or []
        if doc.get("connector", {}).get("state") == "RUNNING" and tasks and all(
                t.get("state") == "RUNNING" for t in tasks):
            return "RUNNING"
        return str(doc.get("connector", {}).get("state"))

    def kill(self) -> None:
        """kill -9 (no offset flush: Connect re-delivers what it had not stored)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)
        self.proc = None

    def resnapshot(self) -> None:
        """Forget the connector's offsets (stopped): its next start reads every row again (snapshot.mode=initial
        with no stored offset), as after a lost offsets topic or an operator's re-snapshot."""
        assert self.proc is None
        self.offsets.unlink(missing_ok=True)

    def drop_slot(self, dsn: str) -> None:
        with psycopg.connect(dsn, autocommit=True) as conn:
            for _ in range(60):
                row = conn.execute("SELECT active FROM pg_replication_slots WHERE slot_name = %s",
                                   (self.slot,)).fetchone()
                if row is None:
                    return
                if not row[0]:
                    conn.execute("SELECT pg_drop_replication_slot(%s)", (self.slot,))
                    return
                time.sleep(0.5)

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    @property
    def heartbeat_topic(self) -> str:
        """Where Debezium writes a heartbeat every second once it streams (after its snapshot)."""
        return f"__debezium-heartbeat.{self.prefix}"

    def topics(self) -> list[str]:
        return [f"{self.prefix}.{t}" for t in TABLES.split(",")]
