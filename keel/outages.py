"""An outage logged at both ends, not at every retry: one WARNING when it starts, a reminder at most every
`interval_s` with how many failures came since, one INFO when it ends.

Retry loops fail many times a second through an outage that heals itself (a broker restarting, Redis out of
memory for 20 s): a line per failure buries the one that says what happened (issue 44: aiokafka wrote ~40
ERROR lines a second per worker while a broker was down). Two users:

* Keel's own retry loops (workers/pipeline.py): `failed(cause)` on each failed attempt, `ok()` on success.
* The Kafka clients' connection errors (`KAFKA`): keel/logs.py's filter hands aiokafka's records about an
  unreachable broker to `library_record`, which counts them instead of letting them through; Keel's Kafka
  boundary (keel/kafka.py) calls `KAFKA.ok()` when an operation succeeds, which ends the outage. With
  `--log-level debug` the library lines pass as they are (the filter does not take them).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

INTERVAL_S = 30.0


class OutageLog:
    """The log lines of one kind of outage (thread-safe: library records arrive on any thread)."""

    def __init__(self, log: logging.Logger, what: str, *, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, end_line: bool = True) -> None:
        """`what` names the failing thing ("Kafka", "writes of finance"); `end_line`: log the INFO at the end
        (False when the caller logs its own, as a worker's progress clock does)."""
        self.log = log
        self.what = what
        self.interval_s = interval_s
        self.clock = clock
        self.end_line = end_line
        self.since: float | None = None       # start of the current outage (None: none)
        self.failures = 0                     # in the current outage
        self._held = 0                        # failures since the last line
        self._last_line = 0.0
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self.since is not None

    def failed(self, cause: str) -> None:
        """One failed attempt: the first logs a WARNING, later ones a reminder at most every interval."""
        now = self.clock()
        with self._lock:
            self.failures += 1
            if self.since is None:
                self.since, self._last_line, self._held = now, now, 0
                line: tuple[str, tuple[object, ...]] | None = ("%s failing, retrying until it works: %s",
                                                               (self.what, cause))
            elif now - self._last_line >= self.interval_s:
                self._held += 1
                line = ("%s still failing after %.0fs (%d failure(s) since the last line): %s",
                        (self.what, now - self.since, self._held, cause))
                self._last_line, self._held = now, 0
            else:
                self._held += 1
                line = None
        if line is not None:
            self.log.warning(line[0], *line[1])

    def ok(self) -> None:
        """The failing thing worked: end the outage (one INFO, when there was one)."""
        if self.since is None:          # the common case, without the lock
            return
        now = self.clock()
        with self._lock:
            if self.since is None:
                return
            seconds, failures = now - self.since, self.failures
            self.since, self.failures, self._held = None, 0, 0
        if self.end_line:
            self.log.info("%s working again after %.0fs (%d failure(s) in all)", self.what, seconds, failures)


KAFKA = OutageLog(logging.getLogger("keel.kafka"), "Kafka (a broker unreachable)")

# aiokafka's message templates that mean a broker or coordinator cannot be reached (client.py, conn.py,
# consumer/fetcher.py, consumer/group_coordinator.py, producer/sender.py): what a broker outage writes.
BROKER_UNREACHABLE = ("Unable connect to", "Unable to request metadata", "Unable to update metadata",
                      "Failed fetch messages", "Failed fetch offsets", "Heartbeat send request failed",
                      "Group Coordinator Request failed", "Marking the coordinator dead", "Cannot send",
                      "Could not send", "FindCoordinator Request failed", "Heartbeat failed for group",
                      "Got error produce response", "Heartbeat session expired", "Coordinator dead",
                      "OffsetCommit failed before join", "Error sending %s to node",
                      "Attempt to fetch offsets for partition")     # a leader moving off a broker that left


def library_record(record: logging.LogRecord, outage: OutageLog = KAFKA) -> bool:
    """Whether `record` is a Kafka client's line about an unreachable broker, taken into `outage` (then it is
    not to be emitted). Lines pass untouched when the library's logger is open at DEBUG (`--log-level debug`)."""
    name = record.name
    if not (name == "aiokafka" or name.startswith("aiokafka.")) or record.levelno < logging.WARNING:
        return False
    if not str(record.msg).startswith(BROKER_UNREACHABLE):
        return False
    if logging.getLogger(name).getEffectiveLevel() <= logging.DEBUG:
        return False
    try:
        cause = record.getMessage()
    except (TypeError, ValueError):     # a malformed library call: its template is still a cause
        cause = str(record.msg)
    outage.failed(cause)
    return True
