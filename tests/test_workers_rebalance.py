"""Issue 10: several `keel worker` processes on one topic, membership changed under a backlog while a
batch is planned or being written. Before the fix, a join during a batch hung the first worker for good
(its rebalance callback waited for the consume loop, parked in a fetch that waits for the rebalance).
Each scenario must end with lag 0, Redis equal to the embedded build and every worker ending on SIGTERM.
The same scenarios run many times with big backlogs in `make soak`."""
from __future__ import annotations

from pathlib import Path

import pytest
from support.rebalance import CI, SCENARIOS, run_scenario
from support.workers import services, services_env

pytestmark = [services, pytest.mark.timeout(900)]


@pytest.mark.parametrize("kind", SCENARIOS)
def test_membership_changes_under_a_backlog_never_hang_or_double(kind: str, tmp_path: Path) -> None:
    run_scenario(kind, tmp_path, services_env(), CI, seed=SCENARIOS.index(kind) + 1)
