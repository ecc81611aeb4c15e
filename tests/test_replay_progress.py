"""The replay's progress on stderr and its summary: a bar on a terminal, otherwise a line every few seconds;
with every tenant (--all) a count of tenants switched instead of one line per tenant, and a one-line summary.
The last test runs `keel replay --all` on real Kafka and Redis (stderr a pipe, so the plain lines)."""
from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from support.replay import count_lines, finance_file
from support.workers import embedded_digests, keel, redis_digests, services_env, unique_cartridge

from keel.cartridge import load_cartridge
from workers.replay import ReplayReport, TenantResult
from workers.replay_progress import Progress


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


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


def test_without_a_terminal_a_line_every_few_seconds_counts_tenants_and_names_none() -> None:
    clock, out = Clock(), io.StringIO()
    progress = Progress("replay finance", stream=out, tty=False, every_s=5, clock=clock)
    assert progress.every_s == 5
    progress.partition = (3, 4, 8)
    for second in range(13):                          # an update per second, a tenant switched every 4 s
        clock.now = float(second)
        progress.update(1000 * second, 20_000, 900 * second)
        if second % 4 == 3:
            progress.switched()                       # --all: counted, not said
    progress.end()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3, lines                     # at 0 s, 5 s and 10 s
    assert lines[0].startswith("replay finance: partition 3 (4/8), 0/20,000 records scanned")
    assert "10,000/20,000 records scanned, 9,000 events applied, 2 tenants switched, 900 events/s" in lines[2]
    assert not any("generation" in line for line in lines)


def test_a_plain_stream_defaults_to_a_line_every_five_seconds() -> None:
    assert Progress("replay", stream=io.StringIO()).every_s == 5.0      # StringIO is no terminal


def test_named_tenants_get_a_line_each() -> None:
    out = io.StringIO()
    progress = Progress("replay finance", stream=out, tty=False, clock=Clock())
    progress.switched("hogar-a: switched generation 1 -> 2 (10 events); old generation dropped")
    assert out.getvalue() == "hogar-a: switched generation 1 -> 2 (10 events); old generation dropped\n"
    assert progress.tenants == 1


def test_on_a_terminal_a_bar_shows_records_and_tenants_switched(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "160")              # rich's width of a terminal it cannot ask
    clock, out = Clock(), io.StringIO()
    progress = Progress("replay finance", stream=out, tty=True, clock=clock)
    progress.update(0, 4000, 0)
    for second in range(1, 5):
        clock.now = float(second)
        progress.update(1000 * second, 4000, 1000 * second)
        progress.switched()
    progress.end()
    screen = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())   # without the terminal's escape codes
    assert "4000/4000 records" in screen and "4 tenants switched" in screen
    assert "100%" in screen


def test_quiet_prints_nothing() -> None:
    out = io.StringIO()
    progress = Progress("replay", stream=out, tty=False, quiet=True)
    progress.update(10, 10, 10, force=True)
    progress.switched("hogar-a: switched")
    progress.note("a retry")
    progress.end()
    assert out.getvalue() == ""


def _report(tenants: int, *, every: bool) -> ReplayReport:
    report = ReplayReport("finance", "keel.finance.events", scanned=400_000, seconds=25.0, every=every)
    for i in range(tenants):
        report.results.append(TenantResult(f"hogar-{i:03d}", i % 8, 1, 2, applied=600, skipped=1, switched=True))
    return report


def test_the_summary_of_every_tenant_is_one_line() -> None:
    summary = _report(600, every=True).summary()
    assert summary == ("replayed finance from keel.finance.events: 600 tenant(s) switched, 400,000 record(s) "
                       "scanned in 25.0s, 16,000 records/s; 360,000 event(s) applied, 600 skipped (rejected or "
                       "handler failed; already dead-lettered), 0 duplicate(s)")


def test_the_summary_of_named_tenants_has_a_line_each() -> None:
    lines = _report(2, every=False).summary().splitlines()
    assert lines[0].startswith("replayed finance from keel.finance.events: 2 tenant(s) switched")
    assert lines[1] == ("  hogar-000: partition 0, generation 1 -> 2 (switched), 600 applied, 1 skipped, "
                        "old generation dropped (0 keys)")
    assert len(lines) == 3


@pytest.mark.services
def test_replay_all_prints_progress_lines_and_one_summary_not_a_line_per_tenant(tmp_path: Path) -> None:
    env = services_env()
    cartridge = unique_cartridge(tmp_path, "finance")
    tenants = {f"hogar-{i:02d}": 60 for i in range(24)}
    events = finance_file(tmp_path / "events.jsonl", tenants)
    keel("publish", str(cartridge), str(events), "--quiet", env=env)
    out = keel("replay", str(cartridge), "--all", env=env)       # stderr is a pipe: plain lines
    assert out.stdout.splitlines() == [out.stdout.strip()], out.stdout
    assert re.search(rf"24 tenant\(s\) switched, {count_lines(events):,} record\(s\) scanned in [0-9.]+s, "
                     r"[0-9,]+ records/s; ", out.stdout), out.stdout
    progress = out.stderr.splitlines()
    assert progress and all(line.startswith(f"replay {load_cartridge(cartridge).name}: ") for line in progress), \
        out.stderr
    assert not any(t in out.stderr for t in tenants), out.stderr
    expected = embedded_digests(load_cartridge(cartridge), events)
    assert redis_digests(cartridge, env, expected) == expected
