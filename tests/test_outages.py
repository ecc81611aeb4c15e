"""Issue 44: a broker outage that heals itself wrote ~40 aiokafka ERROR lines a second per worker. An outage is
now one WARNING when it starts, a reminder at most every 30 s with the count, one INFO when it ends; the Kafka
clients' lines about an unreachable broker are counted into it, and pass as they are at --log-level debug."""
from __future__ import annotations

import logging

import pytest

from keel.logs import RateLimitFilter
from keel.outages import OutageLog, library_record


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def text(self) -> list[tuple[str, str]]:
        return [(r.levelname, r.getMessage()) for r in self.records]


@pytest.fixture
def lines():
    handler = Lines()
    log = logging.getLogger("keel.test-outages")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    yield log, handler
    log.removeHandler(handler)


def rec(name: str, msg: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_one_warning_a_reminder_per_interval_with_the_count_and_one_info(lines) -> None:
    log, handler = lines
    now = [0.0]
    outage = OutageLog(log, "Kafka", interval_s=30, clock=lambda: now[0])
    for i in range(2400):                   # 40 a second for 60 s
        now[0] = i / 40
        outage.failed("Unable connect to node with id 1")
    now[0] = 61.0
    outage.ok()
    outage.ok()                             # nothing more: the outage ended once
    assert handler.text() == [
        ("WARNING", "Kafka failing, retrying until it works: Unable connect to node with id 1"),
        ("WARNING", "Kafka still failing after 30s (1200 failure(s) since the last line): Unable connect to node with id 1"),
        ("INFO", "Kafka working again after 61s (2400 failure(s) in all)"),
    ]
    assert not outage.active


def test_without_an_end_line_the_caller_logs_the_end(lines) -> None:
    log, handler = lines
    outage = OutageLog(log, "batches", end_line=False, clock=lambda: 0.0)
    outage.failed("x")
    outage.ok()
    assert [level for level, _ in handler.text()] == ["WARNING"] and not outage.active


def test_the_kafka_clients_broker_lines_are_taken_not_emitted(lines) -> None:
    log, handler = lines
    outage = OutageLog(log, "Kafka", clock=lambda: 0.0)
    taken = [library_record(rec("aiokafka.client", "Unable connect to node with id %s: %s", 1, "refused"), outage)
             for _ in range(100)]
    assert all(taken)
    assert library_record(rec("aiokafka.consumer.group_coordinator", "Error sending %s to node %s [%s] -- marking "
                              "coordinator dead", "HeartbeatRequest", 2, "NodeNotReadyError"), outage)   # the chaos tier's
    assert not library_record(rec("aiokafka.cluster", "Topic %s not found in cluster metadata", "t"), outage)
    assert not library_record(rec("keel.worker", "Unable connect to node with id %s: %s", 1, "x"), outage)
    assert not library_record(rec("aiokafka.client", "Unable connect to node with id %s: %s", 1, "x",
                                  level=logging.INFO), outage)
    first = "Kafka failing, retrying until it works: Unable connect to node with id 1: refused"
    assert handler.text() == [("WARNING", first)]


def test_at_debug_the_library_lines_pass_as_they_are(lines) -> None:
    log, _ = lines
    outage = OutageLog(log, "Kafka", clock=lambda: 0.0)
    library = logging.getLogger("aiokafka.client")
    before = library.level
    library.setLevel(logging.DEBUG)
    try:
        assert not library_record(rec("aiokafka.client", "Unable connect to node with id %s: %s", 1, "x"), outage)
        assert not outage.active
    finally:
        library.setLevel(before)


def test_the_process_filter_drops_broker_lines_into_the_kafka_outage() -> None:
    from keel.outages import KAFKA
    f = RateLimitFilter(interval_s=30, clock=lambda: 0.0)
    try:
        assert not f.filter(rec("aiokafka.consumer.fetcher", "Failed fetch messages from %s: %s", 1, "x"))
        assert KAFKA.active
    finally:
        KAFKA.ok()
    assert not KAFKA.active


def test_library_loggers_sit_at_warning_unless_debug() -> None:
    from keel.logs import dict_config
    assert dict_config("text")["root"]["level"] == "WARNING"
    assert dict_config("text", "DEBUG", libraries="DEBUG")["root"]["level"] == "DEBUG"
