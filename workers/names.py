"""Names Keel gives its Kafka resources (DESIGN §6): one events topic and one dead-letter topic per cartridge."""
from __future__ import annotations


def events_topic(cartridge: str) -> str:
    """`keel.<cartridge>.events`: envelopes, key = tenant."""
    return f"keel.{cartridge}.events"


def dlq_topic(cartridge: str) -> str:
    """`keel.<cartridge>.dlq`: rejected records with their original bytes and a reason in the headers."""
    return f"keel.{cartridge}.dlq"


def group_id(cartridge: str) -> str:
    """The consumer group of a cartridge's workers, whatever other cartridges a worker also serves."""
    return f"keel.{cartridge}.worker"
