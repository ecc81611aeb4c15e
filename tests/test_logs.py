"""Issue 10: library errors flood the logs while a service is down (160,568 aiokafka lines in 35 s); the
core's filter lets one line per cause per interval through and says how many it held back."""
from __future__ import annotations

import logging

from keel.logs import RateLimitFilter, install


def rec(name: str, msg: str, *args: object, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, args, None)


def test_one_line_per_cause_per_interval_with_the_count_held_back() -> None:
    now = [0.0]
    f = RateLimitFilter(interval_s=30, clock=lambda: now[0])
    # (a broker outage's lines are not rate-limited but taken whole by keel/outages.py: tests/test_outages.py)
    passed = [f.filter(rec("aiokafka.cluster", "Topic %s not found in cluster metadata", f"t{i}")) for i in range(1000)]
    assert passed.count(True) == 1 and passed[0]
    assert f.filter(rec("aiokafka.cluster", "Error fetching metadata for topic %s: %s", 1, "x"))  # another cause
    now[0] = 31.0
    later = rec("aiokafka.cluster", "Topic %s not found in cluster metadata", "t")
    assert f.filter(later)
    assert later.getMessage() == "Topic t not found in cluster metadata [999 more like this in the last 30s not shown]"
    assert not f.filter(rec("aiokafka.cluster", "Topic %s not found in cluster metadata", "t"))


def test_keel_lines_and_library_info_are_never_held_back() -> None:
    f = RateLimitFilter(interval_s=30, clock=lambda: 0.0)
    assert all(f.filter(rec("keel.worker.finance", "batch not written, retrying")) for _ in range(50))
    assert all(f.filter(rec("aiokafka.consumer", "Joined group", level=logging.INFO)) for _ in range(50))


def test_install_filters_the_root_handlers_and_the_last_resort() -> None:
    handler = logging.StreamHandler()
    root = logging.getLogger()
    root.addHandler(handler)
    try:
        installed = install()
        assert install() is installed                        # idempotent: one filter, once per handler
        assert handler.filters.count(installed) == 1 and installed in logging.lastResort.filters
    finally:
        root.removeHandler(handler)
