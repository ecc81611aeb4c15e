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

import json
import re
import secrets
import time
from collections.abc import Iterable, Mapping
from typing import Any

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from .cartridge import Cartridge
from .cartridge_spec import PersonalSpec
from .decoding import json_value
from .envelope import ANNOTATED
from .errors import BadTime, EnvelopeRejected, PersonalDataInClear, UsageError
from .identifiers import ENTITY
from .keystore import KeyStore, b64, unb64
from .times import parse_time

ENC = "keel.enc"            # the key that marks an encrypted field
NOTE_MASK = "[erased]"      # what a note on an erased data subject's entity reads as, when the cartridge declares
                            # no text mask for that entity type's personal fields (note_masks)
CACHE_SECONDS = 5.0         # how long a process reuses what the key store said (a key, an erasure)
WIRE = "v1"


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


def note_masks(cartridge: Cartridge) -> dict[str, str]:
    """{entity type: what a note on an erased data subject of that type reads as}: the `mask:` the cartridge
    declares for the personal fields of that type's own events (`personal:` entries with `of: subject` whose event
    type's subject is that type), the first by event type that is text (a note's value, and a withdrawal's reason,
    may be any text; a number mask fits a number field, not a note). Types without one read as NOTE_MASK."""
    spec = cartridge.spec
    masks: dict[str, str] = {}
    for event_type, personal in sorted(spec.personal.items()):
        event = spec.events.get(event_type)
        if event is not None and personal.subject_field() is None and isinstance(personal.mask, str):
            masks.setdefault(event.subject, personal.mask)
    return masks


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
        self._note_masks = note_masks(cartridge)

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
        its erasure: its value (and a withdrawal's reason) read as the mask the cartridge declares for that entity
        type's personal fields (note_masks; else NOTE_MASK), like those fields (docs/privacy.md). Later notes,
        and notes on other entities, are kept as written."""
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
        mask = self._note_masks.get(subject.partition(":")[0], NOTE_MASK)
        masked = {k: mask for k in ("value", "reason") if payload.get(k) is not None}
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
