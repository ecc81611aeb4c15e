"""Client-library log lines, rate-limited: one line per cause per interval, with how many were held back.

With Kafka down for 35 s the webhook wrote 160,568 aiokafka ERROR lines (issue 10): the libraries log every
retry. Keel's own lines are not touched; records of the LIBRARIES' loggers at WARNING and above are let
through once per cause (logger, level and message template, so "Unable connect to %r" is one cause whatever
the address) per `interval_s`; the next one let through says how many were held back since. Every entry
point calls `install()` after it configured logging (the filter sits on the root logger's handlers and on
`logging.lastResort`, the handler of processes that configured none).
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

LIBRARIES = ("aiokafka", "kafka", "redis", "aiohttp", "faust", "mode", "asyncio", "psycopg", "mcp", "uvicorn")
INTERVAL_S = 30.0


class RateLimitFilter(logging.Filter):
    """Lets one record per cause per interval through (library loggers, WARNING and above)."""

    def __init__(self, interval_s: float = INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 libraries: tuple[str, ...] = LIBRARIES) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.clock = clock
        self.libraries = libraries
        self._causes: dict[tuple[str, int, str], list[float | int]] = {}    # cause -> [last let through, held]
        self._lock = threading.Lock()

    def _limited(self, record: logging.LogRecord) -> bool:
        name = record.name
        return record.levelno >= logging.WARNING and any(
            name == lib or name.startswith(lib + ".") for lib in self.libraries)

    def filter(self, record: logging.LogRecord) -> bool:
        if not self._limited(record):
            return True
        cause = (record.name, record.levelno, str(record.msg))
        now = self.clock()
        with self._lock:
            state = self._causes.get(cause)
            if state is not None and now - float(state[0]) < self.interval_s:
                state[1] = int(state[1]) + 1
                return False
            held = 0 if state is None else int(state[1])
            self._causes[cause] = [now, 0]
            if len(self._causes) > 10_000:            # causes are message templates: few; this is a safety net
                self._causes = {cause: self._causes[cause]}
        if held:
            record.msg = f"{record.msg} [{held} more like this in the last {self.interval_s:.0f}s not shown]"
        return True


_installed: RateLimitFilter | None = None


def install(interval_s: float = INTERVAL_S) -> RateLimitFilter:
    """Put the (one, shared) filter on the root logger's handlers and on logging.lastResort; idempotent,
    and to be called again after a framework replaced the handlers (faust does, at start)."""
    global _installed
    if _installed is None:
        _installed = RateLimitFilter(interval_s)
    handlers = list(logging.getLogger().handlers)
    if logging.lastResort is not None:
        handlers.append(logging.lastResort)
    for handler in handlers:
        if _installed not in handler.filters:
            handler.addFilter(_installed)
    return _installed
