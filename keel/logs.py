"""The one log setup of every Keel process: `--log-format text|json` (env KEEL_LOG_FORMAT), same fields.

Every line carries `ts` (UTC, ISO 8601, milliseconds), `level`, `logger` and `message`, plus the
structured fields a caller passes as `extra={"fields": {...}}` (a tool call's tool, tenant, latency...).
`json` writes them as one JSON object per line (for collectors); `text` as
`<ts> <LEVEL> <logger>: <message> key=value ...` (for people). Lines go to stderr.

Client libraries log every retry (with Kafka down for 35 s the webhook once wrote 160,568 aiokafka ERROR
lines, issue 10), so records of the LIBRARIES' loggers at WARNING and above are rate-limited: one line per
cause (logger, level, message template) per interval, the next one saying how many were held back. Their lines
about an unreachable Kafka broker are not emitted at all: keel/outages.py counts them into one WARNING when the
outage starts, a reminder at most every 30 s and one INFO when it ends (with `--log-level debug` they pass).
`setup_logging` installs the filter; an entry point that configures logging otherwise (faust's Worker
replaces the handlers at start) calls `install()` afterwards.
"""
from __future__ import annotations

import argparse
import json
import logging
import logging.config
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from .outages import library_record

LOG_FORMATS = ("text", "json")
FIELDS = "fields"          # the `extra` key holding a record's structured fields


def _timestamp(record: logging.LogRecord) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z"


def _fields(record: logging.LogRecord) -> Mapping[str, Any]:
    fields = getattr(record, FIELDS, None)
    return fields if isinstance(fields, Mapping) else {}


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, message, the record's fields (and exc when any)."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {"ts": _timestamp(record), "level": record.levelname.lower(), "logger": record.name,
                               "message": record.getMessage()}
        doc.update(_fields(record))
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        return json.dumps(doc, ensure_ascii=False, separators=(",", ":"), default=str)


class TextFormatter(logging.Formatter):
    """`<ts> <LEVEL> <logger>: <message> key=value ...` (and the traceback on the next lines)."""

    def format(self, record: logging.LogRecord) -> str:
        line = f"{_timestamp(record)} {record.levelname} {record.name}: {record.getMessage()}"
        fields = _fields(record)
        if fields:
            line += " " + " ".join(f"{k}={json.dumps(v, ensure_ascii=False, default=str)}"
                                   if isinstance(v, str) and (" " in v or not v) else f"{k}={v}"
                                   for k, v in fields.items())
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    """`--log-format` for a process command."""
    parser.add_argument("--log-format", choices=LOG_FORMATS, default=None,
                        help="log lines as text or JSON, same fields (env KEEL_LOG_FORMAT, default text)")


def log_format(flag: str | None, env: Mapping[str, str] | None = None) -> str:
    """The flag, else KEEL_LOG_FORMAT, else text."""
    value = flag or (os.environ if env is None else env).get("KEEL_LOG_FORMAT") or "text"
    if value not in LOG_FORMATS:
        from .errors import UsageError
        raise UsageError(f"KEEL_LOG_FORMAT={value!r}: use one of {', '.join(LOG_FORMATS)}")
    return value


def dict_config(fmt: str, level: str | int = "INFO", *, libraries: str | int = "WARNING") -> dict[str, Any]:
    """A logging.config.dictConfig document: Keel's loggers at `level`, everything else (client libraries)
    at `libraries`, one stderr handler with the chosen formatter. faust's Worker takes it as is."""
    level = level.upper() if isinstance(level, str) else level
    formatter = JsonFormatter if fmt == "json" else TextFormatter
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"keel": {"()": f"{formatter.__module__}.{formatter.__qualname__}"}},
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "keel", "stream": "ext://sys.stderr"}},
        "loggers": {"keel": {"level": level}},
        "root": {"level": libraries, "handlers": ["stderr"]},
    }


def setup_logging(fmt: str, level: str | int = "INFO", *, libraries: str | int = "WARNING") -> None:
    """Configure the process's logging once, at its entry point (the library rate limit included)."""
    logging.config.dictConfig(dict_config(fmt, level, libraries=libraries))
    install()


LEVELS = {"crit": "CRITICAL", "error": "ERROR", "warn": "WARNING", "info": "INFO", "debug": "DEBUG"}


# ---- client libraries' lines, rate-limited --------------------------------------------------------

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
        if library_record(record):          # a broker outage: counted by keel/outages.py, logged by it
            return False
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
