"""Personal data by crypto-shredding (docs/privacy.md): a cartridge's `personal:` fields are encrypted with
AES-256-GCM (the `cryptography` package) under a data key per (tenant, data subject); data keys are kept
wrapped by a master key in a key store; erasing a data subject deletes its keys, after which every copy of the
ciphertext reads as the cartridge's mask, deterministically.

An encrypted field's wire form (version 1):

    {"keel.enc": "v1", "kid": "<key id>", "iv": "<base64 12 bytes>", "ct": "<base64 ciphertext + 16-byte tag>"}

The plaintext is the field's JSON value (UTF-8, compact); the associated data (`field_ad`) is `keel.enc/v1`
followed by tenant, data subject, event id and field, each as a 4-byte big-endian length and its UTF-8 bytes, so
a ciphertext moved to another tenant, subject, event or field does not verify. Nothing here logs or puts a
personal value in an error message.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .cartridge import Cartridge
from .cartridge_spec import PersonalSpec
from .decoding import json_value
from .envelope import ANNOTATED
from .errors import BadTime, EnvelopeRejected, PersonalDataInClear, UsageError
from .identifiers import ENTITY
from .times import format_time, now_micros, parse_time

ENC = "keel.enc"            # the key that marks an encrypted field
NOTE_MASK = "[erased]"      # what a note on an erased data subject's entity reads as
CACHE_SECONDS = 5.0         # how long a process reuses what the key store said (a key, an erasure)
WIRE = "v1"
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


def is_encrypted(value: object) -> bool:
    return isinstance(value, dict) and ENC in value


def field_ad(tenant: str, subject: str, event_id: str, field: str) -> bytes:
    """The associated data of a field: `keel.enc/v1`, then tenant, data subject, event id and field name, each
    as its UTF-8 length (4 bytes, big-endian) and its UTF-8 bytes: unambiguous, and the same in any language."""
    out = bytearray(b"keel.enc/v1")
    for part in (tenant, subject, event_id, field):
        data = part.encode()
        out += len(data).to_bytes(4, "big") + data
    return bytes(out)


def encrypt_field(value: Any, key: bytes, kid: str, *, tenant: str, subject: str, event_id: str,
                  field: str) -> dict[str, str]:
    """A JSON value as its wire form, bound to tenant, data subject, event and field."""
    iv = secrets.token_bytes(12)
    plain = json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()
    ct = AESGCM(key).encrypt(iv, plain, field_ad(tenant, subject, event_id, field))
    return {ENC: WIRE, "kid": kid, "iv": b64(iv), "ct": b64(ct)}


def decrypt_field(wire: Mapping[str, Any], key: bytes | AESGCM, *, tenant: str, subject: str, event_id: str,
                  field: str) -> Any:
    """The JSON value of a wire form. Raises ValueError (never naming the value) when it does not verify."""
    if wire.get(ENC) != WIRE or set(wire) != {ENC, "kid", "iv", "ct"}:
        raise ValueError(f"not a {ENC} {WIRE} value (keys {ENC}, kid, iv, ct)")
    iv, ct = unb64(wire["iv"], "iv"), unb64(wire["ct"], "ct")
    if len(iv) != 12:
        raise ValueError("iv: 12 bytes expected")
    try:
        cipher = key if isinstance(key, AESGCM) else AESGCM(key)
        plain = cipher.decrypt(iv, ct, field_ad(tenant, subject, event_id, field))
    except InvalidTag:
        raise ValueError("does not verify (altered, or moved from another event, field or data subject)") from None
    return _decode(plain)


class Privacy:
    """A cartridge's personal fields over a key store: `seal` encrypts an envelope's, `reveal` decrypts them (the
    mask for an erased key) so that the envelope reads exactly as it was written in clear."""

    def __init__(self, cartridge: Cartridge, keys: KeyStore | None) -> None:
        """`keys` None: no key store was given; `reveal` then refuses an encrypted field, saying so."""
        self.cartridge = cartridge
        self.keys = keys
        self.personal: dict[str, PersonalSpec] = dict(cartridge.spec.personal)
        self.accept_clear = cartridge.spec.personal_accept_clear    # `personal: {accept_clear: true}`
        # a line may be of a personal type when it names one (or escapes a character: a name can hide behind \u)
        self._type_bytes = tuple(json.dumps(t).encode() for t in self.personal) + (b"\\",)
        self._note_bytes = json.dumps(ANNOTATED).encode()
        self._erased: dict[tuple[str, str], tuple[int | None, float]] = {}  # (tenant, subject) -> (when, until)

    def data_subject(self, envelope: Mapping[str, Any]) -> str:
        """Whose the personal fields of an envelope are: its subject, or the payload field `of` names."""
        spec = self.personal[envelope["type"]]
        name = spec.subject_field()
        value = envelope.get("subject") if name is None else (envelope.get("payload") or {}).get(name)
        if not isinstance(value, str) or not ENTITY.match(value):
            raise EnvelopeRejected(f"{spec.of}: required, the entity reference (type:id) of the data subject whose "
                                   f"personal fields these are", event_id=_str(envelope.get("id")),
                                   tenant=_str(envelope.get("tenant")))
        return value

    def _applies(self, envelope: object) -> bool:
        return (isinstance(envelope, dict) and envelope.get("type") in self.personal
                and isinstance(envelope.get("payload"), dict) and isinstance(envelope.get("id"), str)
                and isinstance(envelope.get("tenant"), str))

    def seal(self, envelope: dict[str, Any]) -> dict[str, Any]:
        """The envelope with its personal fields encrypted (keys created as needed); fields already encrypted,
        absent or null are kept. Other envelopes are returned as they are."""
        if not self._applies(envelope):
            return envelope
        payload = envelope["payload"]
        fields = [f for f in self.personal[envelope["type"]].fields
                  if payload.get(f) is not None and not is_encrypted(payload[f])]
        if not fields:
            return envelope
        tenant, event_id, subject = envelope["tenant"], envelope["id"], self.data_subject(envelope)
        if self.keys is None:
            raise UsageError("sealing needs a key store (--keys FILE)")
        kid, key = self.keys.key_for(tenant, subject)
        sealed = dict(payload)
        for f in fields:
            sealed[f] = encrypt_field(payload[f], key, kid, tenant=tenant, subject=subject, event_id=event_id,
                                      field=f)
        return {**envelope, "payload": sealed}

    def clear_fields(self, envelope: object) -> list[str]:
        """The personal fields an envelope holds in clear (present, not null, not encrypted)."""
        if not (isinstance(envelope, dict) and envelope.get("type") in self.personal
                and isinstance(envelope.get("payload"), dict)):
            return []
        payload = envelope["payload"]
        return [f for f in self.personal[envelope["type"]].fields
                if payload.get(f) is not None and not is_encrypted(payload[f])]

    def masked(self, envelope: dict[str, Any], fields: list[str]) -> dict[str, Any]:
        """The envelope with `fields` of its payload replaced by the cartridge's mask (what a dead letter keeps)."""
        mask = self.personal[envelope["type"]].mask
        return {**envelope, "payload": {**envelope["payload"], **dict.fromkeys(fields, mask)}}

    def refuse_clear(self, envelope: object, *, clear_ok: bool = False) -> None:
        """Raise PersonalDataInClear (naming the fields, never their values; carrying the envelope with those
        fields masked, for the dead letter) when personal fields arrive in clear and the cartridge does not
        accept them in clear (`personal: {accept_clear: true}`) and the caller does not (`clear_ok`: an
        ingress that seals them before they are written, `keel publish`)."""
        if clear_ok or self.accept_clear:
            return
        fields = self.clear_fields(envelope)
        if not fields:
            return
        assert isinstance(envelope, dict)
        names = ", ".join(f"payload.{f}" for f in fields)
        raise PersonalDataInClear(
            f"{names}: personal data in clear (not shown); cartridge {self.cartridge.name!r} requires its personal "
            f"fields sealed (keel publish and keel seal seal them; `personal: {{accept_clear: true}}` accepts them "
            f"in clear during a migration window)",
            masked=msgspec.json.encode(self.masked(envelope, fields)), event_id=_str(envelope.get("id")),
            tenant=_str(envelope.get("tenant")))

    def reveal(self, envelope: dict[str, Any], *, clear_ok: bool = False) -> dict[str, Any]:
        """The envelope with its encrypted personal fields decrypted, or masked when their key was erased.
        Raises EnvelopeRejected (naming the field, never its value) when a field does not verify, and
        PersonalDataInClear when a personal field arrives in clear (see `refuse_clear`)."""
        self.refuse_clear(envelope, clear_ok=clear_ok)
        if not self._applies(envelope):
            return self._mask_note(envelope) if _is_note(envelope) else envelope
        spec = self.personal[envelope["type"]]
        payload = envelope["payload"]
        fields = [f for f in spec.fields if is_encrypted(payload.get(f))]
        if not fields:
            return envelope
        if self.keys is None:
            raise EnvelopeRejected(f"payload.{fields[0]}: encrypted personal data; give the key file (--keys FILE, "
                                   f"keel.open(keys=...)) to read it", event_id=_str(envelope.get("id")),
                                   tenant=_str(envelope.get("tenant")))
        tenant, event_id, subject = envelope["tenant"], envelope["id"], self.data_subject(envelope)
        clear = dict(payload)
        for f in fields:
            wire = payload[f]
            try:
                kid = wire.get("kid")
                if not isinstance(kid, str):
                    raise ValueError("kid: required, the id of the data key")  # noqa: TRY004 - as above
                key = self.keys.key(kid)        # asked every time: an erasure in this process counts at once
                clear[f] = spec.mask if key is None else decrypt_field(
                    wire, key, tenant=tenant, subject=subject, event_id=event_id, field=f)
            except ValueError as e:
                raise EnvelopeRejected(f"payload.{f}: encrypted value {e}", event_id=event_id,
                                       tenant=tenant) from None
        return {**envelope, "payload": clear}

    def erased_at(self, tenant: str, subject: str) -> int | None:
        """When the data subject's keys were last erased (microseconds), or None; the key store is asked again
        after CACHE_SECONDS, like a key (an erasure by another process is seen within that time)."""
        now = time.monotonic()
        known = self._erased.get((tenant, subject))
        if known is not None and known[1] > now:
            return known[0]
        done = None if self.keys is None else self.keys.erasure(tenant, subject)
        at = None if done is None else parse_time(done["at"])
        self._erased[(tenant, subject)] = (at, now + CACHE_SECONDS)
        return at

    def _mask_note(self, envelope: dict[str, Any]) -> dict[str, Any]:
        """A note (keel.annotated) attached to an erased data subject's entity, written (occurred_at) before
        its erasure: its value (and a withdrawal's reason) read as the mask, NOTE_MASK, like its personal
        fields (docs/privacy.md). Later notes, and notes on other entities, are kept as written."""
        tenant, subject, payload = envelope["tenant"], envelope["subject"], envelope["payload"]
        at = self.erased_at(tenant, subject)
        if at is None:
            return envelope
        try:
            occurred = parse_time(envelope.get("occurred_at"))
        except BadTime:
            return envelope             # the envelope checks refuse it
        if occurred > at:
            return envelope
        masked = {k: NOTE_MASK for k in ("value", "reason") if payload.get(k) is not None}
        return {**envelope, "payload": {**payload, **masked}} if masked else envelope

    def prefetch(self, raws: Iterable[bytes | None]) -> None:
        """Ask the key store once for every key a batch of records names (`"kid":"…"` in their bytes), before
        `reveal_line` asks for them one by one: a worker's batch of N subjects costs one round trip, not N."""
        if self.keys is None:
            return
        kids = {m.group(1).decode() for raw in raws if raw and _ENC_BYTES in raw for m in _KID.finditer(raw)}
        if kids:
            self.keys.prefetch(kids)

    def reveal_line(self, raw: bytes, *, clear_ok: bool = False) -> bytes:
        """An events file's line (a record's value) with its personal fields revealed, as JSON text again (so the
        envelope checks take their msgspec fast path); the line itself when it holds no encrypted field or is
        not a JSON object (the envelope checks then say what is wrong with it). A line whose personal fields
        are in clear is refused (PersonalDataInClear) unless the cartridge accepts them or `clear_ok`."""
        if _ENC_BYTES not in raw and (clear_ok or self.accept_clear
                                      or not any(t in raw for t in self._type_bytes)) and (
                self._note_bytes not in raw and b"\\" not in raw):
            return raw
        try:
            envelope = _decode(raw)
        except ValueError:
            return raw
        if not isinstance(envelope, dict):
            return raw
        revealed = self.reveal(envelope, clear_ok=clear_ok)
        return raw if revealed is envelope else msgspec.json.encode(revealed)


_ENC_BYTES = ENC.encode()
_KID = re.compile(rb'"kid"\s*:\s*"([0-9a-f]{32})"')


_decode = json_value          # JSON text → value (keel.decoding: msgspec, the json module beyond 64-bit integers)


def masked_line(cartridge: Cartridge, raw: bytes | None) -> bytes | None:
    """A record's value with every personal field the cartridge declares (sealed or in clear) replaced by its
    mask, for a dead letter that must keep none of them (an offboarded tenant's record); the value itself when it
    holds none, or is not a JSON object (Keel cannot tell which part of it is personal)."""
    if raw is None or not cartridge.spec.personal:
        return raw
    try:
        envelope = _decode(raw)
    except ValueError:
        return raw
    spec = cartridge.spec.personal.get(envelope.get("type")) if isinstance(envelope, dict) else None
    payload = envelope.get("payload") if spec is not None else None
    if not isinstance(payload, dict):
        return raw
    fields = [f for f in spec.fields if payload.get(f) is not None]
    if not fields:
        return raw
    return msgspec.json.encode({**envelope, "payload": {**payload, **dict.fromkeys(fields, spec.mask)}})


def _is_note(envelope: object) -> bool:
    return (isinstance(envelope, dict) and envelope.get("type") == ANNOTATED
            and isinstance(envelope.get("payload"), dict) and isinstance(envelope.get("tenant"), str)
            and isinstance(envelope.get("subject"), str))


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None
