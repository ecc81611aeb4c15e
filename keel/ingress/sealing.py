"""Personal fields at the ingress (docs/privacy.md): whatever a product sends, clear or already sealed, leaves
the relay and the webhook for Kafka with the cartridge's personal fields sealed, and never in a dead letter.

Each envelope is opened first (sealed fields revealed, so the catalog checks the values they hold; fields in
clear are accepted, since this ingress seals them), checked, then sealed with the key store (`Privacy.seal`: a
data key per tenant and data subject). A refused envelope's dead letter keeps its personal fields masked.
Without personal fields (or without `personal:` in the cartridge) every step is the identity.
"""
from __future__ import annotations

from typing import Any

from keel.envelope import Event
from keel.privacy import Privacy, masked_line
from keel.wire import canonical_bytes

Item = bytes | dict[str, Any]


class IngressSealing:
    """The ingress's use of one cartridge's Privacy (None: the cartridge declares no personal field)."""

    def __init__(self, privacy: Privacy | None) -> None:
        self.privacy = privacy

    def opened(self, item: Item) -> Item:
        """The envelope with its sealed personal fields revealed (EnvelopeRejected when one does not verify)."""
        if self.privacy is None:
            return item
        if isinstance(item, bytes):
            return self.privacy.reveal_line(item, clear_ok=True)
        return self.privacy.reveal(item, clear_ok=True) if isinstance(item, dict) else item

    def value(self, event: Event) -> bytes:
        """The record value: the canonical envelope, personal fields sealed (KeyStoreUnavailable on an outage)."""
        return canonical_bytes(event, None if self.privacy is None else self.privacy.seal)

    def kept(self, raw: bytes | None) -> bytes | None:
        """What a dead letter keeps of a refused envelope: its bytes with every personal field masked."""
        return raw if self.privacy is None else masked_line(self.privacy.cartridge, raw)
