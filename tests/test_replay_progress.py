"""The replay's progress line: its ETA."""
from __future__ import annotations

import io

from workers.replay_progress import Progress


def test_replay_eta_counts_from_the_first_records_not_from_the_start() -> None:
    """Issue 10: the ETA said 45 s for a 7 s run (start-up time counted as scanning time)."""
    now = [0.0]
    out = io.StringIO()
    progress = Progress("replay", stream=out, tty=False, every_s=0, clock=lambda: now[0])
    now[0] = 10.0                                     # connecting, finding the tenants: nothing scanned
    progress.update(0, 10_000, 0)
    for second in range(1, 4):                        # then 1,000 records per second
        now[0] = 10.0 + second
        progress.update(1000 * second, 10_000, 1000 * second)
    assert out.getvalue().splitlines()[-1].endswith("ETA 7s")
