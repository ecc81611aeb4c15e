"""workers/progress.py: readiness names why ingestion stopped, and one line says when it resumed."""
from __future__ import annotations

import logging

import pytest

from workers.progress import Progress


def test_readiness_names_the_last_outage_once_nothing_progressed_for_too_long(
        caplog: pytest.LogCaptureFixture) -> None:
    waiting = [0]
    p = Progress(30.0, logging.getLogger("keel.test"), "W(finance)", lambda: waiting[0])
    assert p.unready() is None                               # just started: still within the allowance
    p.at -= 45                                               # 45 s without a commit
    assert p.unready() == "no batch committed for 45s: no outage seen: a batch may be slow"
    waiting[0] = 3
    assert p.unready() == "no batch committed for 45s: 3 partition(s) waiting for their resume point"
    p.outage("PostgreSQL: key store (PostgreSQL) connect failed: OperationalError")
    assert p.unready() == ("no batch committed for 45s: PostgreSQL: key store (PostgreSQL) connect failed: "
                           "OperationalError")
    with caplog.at_level(logging.INFO, logger="keel.test"):
        p.progressed()
        p.progressed()                                       # no outage in between: no second line
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [("W(finance): ingestion resumed after 45s without progress (last cause: PostgreSQL: key store "
                      "(PostgreSQL) connect failed: OperationalError)")]
    assert p.unready() is None and p.last_outage is None
