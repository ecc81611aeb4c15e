"""Where data keys live (docs/privacy.md): the key store interface, the key file (FileKeyStore: data keys
wrapped by the master key with AES-256-GCM, written atomically), the master key's resolution from its flag,
file or environment, and the records of erasures and offboardings. keystore_pg.py is the PostgreSQL store;
privacy.py encrypts personal fields with the keys these stores hand out. Nothing here logs a key or puts one in
an error message.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import secrets
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .errors import UsageError
from .times import format_time, now_micros

KEYS_FORMAT = "keel.keys/1"
MASTER_ENV = "KEEL_MASTER_KEY"              # base64 of 32 bytes
MASTER_FILE_ENV = "KEEL_MASTER_KEY_FILE"    # a file holding that base64 text


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: object, what: str) -> bytes:
    if not isinstance(text, str):
        raise ValueError(f"{what}: not base64 text")  # noqa: TRY004 - one error type for every bad wire form
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{what}: not base64 text") from None


def master_key(given: bytes | None = None, *, file: str | Path | None = None,
               env: Mapping[str, str] | None = None) -> bytes:
    """The master key: `given`, else the key `file`, else KEEL_MASTER_KEY, else KEEL_MASTER_KEY_FILE. A usage
    error when none is given or it is not base64 of 32 bytes (the message never shows the key)."""
    env = os.environ if env is None else env
    if given is not None:
        key, where = given, "the master key given"
    else:
        path = file or env.get(MASTER_FILE_ENV)
        if path:
            try:
                text = Path(path).read_text(encoding="ascii").strip()
            except (OSError, UnicodeDecodeError) as e:
                raise UsageError(f"master key file {path} cannot be read: {getattr(e, 'strerror', None) or e}"
                                 ) from None
            where = f"master key file {path}"
        elif env.get(MASTER_ENV):
            text, where = env[MASTER_ENV].strip(), MASTER_ENV
        else:
            raise UsageError(f"no master key: set {MASTER_ENV} (base64 of 32 random bytes, e.g. "
                             f"`openssl rand -base64 32`) or {MASTER_FILE_ENV} (a file holding it)")
        try:
            key = unb64(text, where)
        except ValueError:
            raise UsageError(f"{where}: not base64 text (give base64 of 32 random bytes)") from None
    if len(key) != 32:
        raise UsageError(f"{where}: {len(key)} bytes; AES-256 needs 32 (base64 of 32 random bytes)")
    return key


class KeyStore(Protocol):
    """Where data keys live, wrapped by the master key. Separate from the graph: the graph is rebuilt from the
    log, and the keys are what make the log's personal fields readable."""

    def key_for(self, tenant: str, subject: str) -> tuple[str, bytes]:
        """(key id, data key) of a data subject, created when it has none."""
        ...

    def key(self, kid: str) -> bytes | None:
        """A data key by id; None when it was erased. Raises UsageError for an id the store never held."""
        ...

    def prefetch(self, kids: Iterable[str]) -> None:
        """Make the keys of these ids ready for `key` in one request (a worker's batch); unknown or erased ids
        are left to `key` to answer."""
        ...

    def erase(self, tenant: str, subject: str, *, reason: str | None = None) -> int:
        """Delete every key of a data subject; the number deleted (0: none, or erased before)."""
        ...

    def erasure(self, tenant: str, subject: str) -> dict[str, Any] | None:
        """The record of an erasure of a data subject (when, how many keys), or None."""
        ...

    def offboard(self, tenant: str, *, reason: str | None = None) -> dict[str, Any]:
        """Delete every key of a tenant (keel offboard) and record it: {tenant, at, keys}; a second call deletes
        nothing and returns the first record. No key is created for the tenant afterwards."""
        ...

    def offboarding(self, tenant: str) -> dict[str, Any] | None:
        """The record of a tenant's offboarding, or None."""
        ...


class FileKeyStore:
    """The key store of embedded mode: a JSON file, rewritten atomically (a temporary file in the same folder,
    fsync, rename) with mode 0600 on every change. It holds per key its tenant, data subject and the data key
    wrapped by the master key (AES-256-GCM, the associated data naming tenant, subject and key id); per erased
    key only its id and when; per erasure the tenant, subject, time and count. One process at a time."""

    def __init__(self, path: str | Path, master: bytes, *, create: bool = True) -> None:
        self.path = Path(path)
        self._master = AESGCM(master)
        self._fingerprint = hashlib.sha256(b"keel.master/v1\0" + master).hexdigest()[:16]
        self._current: dict[tuple[str, str], str] = {}
        self._deferred = 0          # inside batch(): the file is written once, at its end
        self._unwrapped: dict[str, bytes] = {}      # key id -> data key, unwrapped once per process
        self._dirty = False
        if self.path.exists():
            self.doc = self._read()
        elif create:
            self.doc = {"format": KEYS_FORMAT, "master": self._fingerprint, "keys": {}, "erased": {},
                        "erasures": []}
        else:
            raise UsageError(f"key file {self.path} not found")
        for kid, entry in self.doc["keys"].items():
            self._current[(entry["tenant"], entry["subject"])] = kid

    def _read(self) -> dict[str, Any]:
        if self.path.is_dir():
            raise UsageError(f"key file {self.path} is a folder")
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except OSError as e:
            raise UsageError(f"key file {self.path} cannot be read: {e.strerror or e}") from None
        except ValueError:
            raise UsageError(f"key file {self.path} is not JSON") from None
        if not isinstance(doc, dict) or doc.get("format") != KEYS_FORMAT or not all(
                isinstance(doc.get(k), t) for k, t in (("keys", dict), ("erased", dict), ("erasures", list))):
            raise UsageError(f"key file {self.path} is not a Keel key file ({KEYS_FORMAT})")
        if doc.get("master") != self._fingerprint:
            raise UsageError(f"key file {self.path} was written under another master key (check "
                             f"{MASTER_ENV} / {MASTER_FILE_ENV})")
        for kid, entry in doc["keys"].items():
            if not (isinstance(entry, dict) and isinstance(entry.get("tenant"), str)
                    and isinstance(entry.get("subject"), str) and isinstance(entry.get("wrapped"), str)):
                raise UsageError(f"key file {self.path}: key {kid!r} is malformed")
        return doc

    @contextmanager
    def batch(self) -> Iterator[None]:
        """Keys created inside are written to the file once, when the block ends (also on an error, so no key
        that sealed a value is lost)."""
        self._deferred += 1
        try:
            yield
        finally:
            self._deferred -= 1
            if not self._deferred and self._dirty:
                self._save()

    def _save(self) -> None:
        if self._deferred:
            self._dirty = True
            return
        self._dirty = False
        folder = self.path.parent if str(self.path.parent) else Path(".")
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", suffix=".tmp", dir=folder)
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.doc, f, indent=1, sort_keys=True)
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        dir_fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    @staticmethod
    def _wrap_ad(tenant: str, subject: str, kid: str) -> bytes:
        return json.dumps(["keel.key/v1", tenant, subject, kid], ensure_ascii=False).encode()

    def key_for(self, tenant: str, subject: str) -> tuple[str, bytes]:
        kid = self._current.get((tenant, subject))
        if kid is not None:
            key = self.key(kid)
            assert key is not None
            return kid, key
        refuse_offboarded(self.offboarding(tenant))
        kid, key = secrets.token_hex(16), AESGCM.generate_key(bit_length=256)
        iv = secrets.token_bytes(12)
        wrapped = iv + self._master.encrypt(iv, key, self._wrap_ad(tenant, subject, kid))
        self.doc["keys"][kid] = {"tenant": tenant, "subject": subject, "wrapped": b64(wrapped),
                                 "created_at": format_time(now_micros())}
        self._current[(tenant, subject)] = kid
        self._save()
        return kid, key

    def key(self, kid: str) -> bytes | None:
        known = self._unwrapped.get(kid)
        if known is not None:
            return known
        entry = self.doc["keys"].get(kid)
        if entry is None:
            if kid in self.doc["erased"]:
                return None
            raise UsageError(f"key {kid!r} is not in key file {self.path} (another key file?)")
        try:
            wrapped = unb64(entry["wrapped"], "wrapped")
            key = self._master.decrypt(wrapped[:12], wrapped[12:], self._wrap_ad(entry["tenant"], entry["subject"], kid))
        except (ValueError, InvalidTag):
            raise UsageError(f"key file {self.path}: key {kid!r} does not unwrap (altered)") from None
        self._unwrapped[kid] = key
        return key

    def prefetch(self, kids: Iterable[str]) -> None:
        return                   # the file is in memory: `key` unwraps on demand

    def erase(self, tenant: str, subject: str, *, reason: str | None = None) -> int:
        kids = sorted(k for k, e in self.doc["keys"].items() if e["tenant"] == tenant and e["subject"] == subject)
        if not kids:
            return 0
        at = format_time(now_micros())
        for kid in kids:
            del self.doc["keys"][kid]
            self._unwrapped.pop(kid, None)
            self.doc["erased"][kid] = at
        self._current.pop((tenant, subject), None)
        self.doc["erasures"].append({"tenant": tenant, "subject": subject, "at": at, "keys": len(kids)})
        self._save()
        return len(kids)

    def erasure(self, tenant: str, subject: str) -> dict[str, Any] | None:
        done = [e for e in self.doc["erasures"] if e.get("tenant") == tenant and e.get("subject") == subject]
        return done[-1] if done else None

    def offboard(self, tenant: str, *, reason: str | None = None) -> dict[str, Any]:
        known = self.offboarding(tenant)
        if known is not None:
            return known
        kids = sorted(k for k, e in self.doc["keys"].items() if e["tenant"] == tenant)
        at = format_time(now_micros())
        for kid in kids:
            del self.doc["keys"][kid]
            self._unwrapped.pop(kid, None)
            self.doc["erased"][kid] = at
        for pair in [p for p in self._current if p[0] == tenant]:
            del self._current[pair]
        done = {"tenant": tenant, "at": at, "keys": len(kids)}
        self.doc.setdefault("offboarded", []).append(done)
        self._save()
        return done

    def offboarding(self, tenant: str) -> dict[str, Any] | None:
        done = [e for e in self.doc.get("offboarded", ()) if e.get("tenant") == tenant]
        return done[0] if done else None


class TenantOffboarded(UsageError):
    """A key asked for a tenant that was offboarded (keel offboard): its events are refused."""

    def __init__(self, tenant: str, at: str) -> None:
        super().__init__(f"tenant {tenant!r} was offboarded at {at} (keel offboard): its events are refused")
        self.tenant = tenant


def refuse_offboarded(done: Mapping[str, Any] | None) -> None:
    """Raise TenantOffboarded for the record of an offboarding (None: the tenant was not offboarded)."""
    if done is not None:
        raise TenantOffboarded(str(done["tenant"]), str(done["at"]))


def open_key_file(path: str | Path, *, create: bool = False, master_file: str | Path | None = None
                  ) -> FileKeyStore:
    """The key file of `--keys FILE` under the configured master key; `create`: a missing file starts empty
    (`keel seal`), else it is a usage error (reads and erasure need the keys the file holds)."""
    return FileKeyStore(path, master_key(file=master_file), create=create)
