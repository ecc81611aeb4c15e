"""The producer API: for a product that publishes to Kafka itself, the record Keel's own ingress would write.

    import keel
    with keel.sealer("cartridges/clinic", keys_dsn="postgresql://keel@db/keys") as s:   # KEEL_MASTER_KEY set
        key, value = s.record(envelope)          # key = the tenant; value = the envelope, personal fields sealed
        producer.send("keel.clinic.events", key=key, value=value)   # acks=all, idempotent (docs/envelope.md)

Each envelope is checked with the cartridge's catalog first (EnvelopeRejected names the field and never a
personal value), then its personal fields are sealed with a data key per (tenant, data subject) from the key
store (docs/privacy.md, "Wire format"). Nothing else of the envelope changes: a `recorded_at` left out stays
out, so the topic's log-append time says when Keel learned the event. A cartridge without `personal:` gets
its envelopes back as they are, checked.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from .cartridge import Cartridge, load_cartridge
from .envelope import Catalog
from .errors import EnvelopeRejected, UsageError
from .privacy import Privacy
from .times import now_micros
from .wire import record_key


class Sealer:
    """Envelopes of one cartridge → (key, value) records with their personal fields sealed."""

    def __init__(self, cartridge: Cartridge, privacy: Privacy | None) -> None:
        self.cartridge = cartridge
        self.topic = cartridge.topic
        self.privacy = privacy
        self._catalog = Catalog(cartridge)

    def seal(self, envelope: Mapping[str, Any]) -> dict[str, Any]:
        """The envelope, checked, with its personal fields sealed (those already sealed are kept)."""
        if not isinstance(envelope, Mapping):
            raise EnvelopeRejected("an envelope must be a JSON object")
        given = dict(envelope)
        opened = self.privacy.reveal(given, clear_ok=True) if self.privacy is not None else given
        self._catalog.parse(opened, default_recorded_at=now_micros())
        return self.privacy.seal(given) if self.privacy is not None else given

    def record(self, envelope: Mapping[str, Any]) -> tuple[bytes, bytes]:
        """(Kafka record key, value) of an envelope: the tenant, and the sealed envelope as compact JSON."""
        sealed = self.seal(envelope)
        return record_key(sealed["tenant"]), json.dumps(sealed, ensure_ascii=False, separators=(",", ":")).encode()

    def close(self) -> None:
        keys = getattr(self.privacy, "keys", None)
        close = getattr(keys, "close", None)
        if callable(close):
            close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def sealer(cartridge: str | Path | Cartridge, *, keys_dsn: str | None = None, keys_file: str | Path | None = None,
           master_key_file: str | Path | None = None) -> Sealer:
    """A Sealer over the key store: `keys_dsn` (PostgreSQL) or `keys_file`; the master key from
    `master_key_file`, else KEEL_MASTER_KEY / KEEL_MASTER_KEY_FILE. A cartridge with `personal:` and no key store
    is a UsageError."""
    c = cartridge if isinstance(cartridge, Cartridge) else load_cartridge(cartridge)
    if not c.spec.personal:
        return Sealer(c, None)
    from .keystore_pg import open_key_store  # psycopg is imported only when a key store is opened
    keys = open_key_store(keys_file=keys_file, keys_dsn=keys_dsn, master_file=master_key_file, create=True)
    if keys is None:
        raise UsageError(f"cartridge {c.name!r} declares personal fields: give keys_dsn= or keys_file=")
    return Sealer(c, Privacy(c, keys))
